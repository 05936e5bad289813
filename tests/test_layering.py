"""The dependency direction app -> core -> kernels holds, core's folders import only downwards in one order, no hone
modules import each other in a circle, and the light modules stay light."""

from __future__ import annotations

import ast
import functools
import re
import subprocess
import sys
from collections import deque
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
QT = ("PySide6", "pyqtgraph", "shiboken6")
PACKAGES = {"app": "hone.app", "core": "hone.core", "kernels": "hone.kernels", "resources": "hone.resources"}


@dataclass(frozen=True)
class Reference:
    """One place a module names another: an import statement (at any depth, relative ones resolved) or a string
    literal (`importlib.import_module("hone...")`, a table of lazily imported modules, a message).

    Attributes:
        source: the module that refers, e.g. "hone.core.train.loss".
        target: the dotted name referred to: for `from pkg import name`, "pkg.name" (a submodule or not); for a
            string, the whole string.
        string: the reference is a string literal, not an import statement.
    """

    source: str
    target: str
    path: Path
    line: int
    string: bool = False

    def __str__(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}: {'string ' if self.string else ''}{self.target}"


@functools.cache
def _modules() -> dict[str, Path]:
    """Every hone module's dotted name -> its file (a package is its __init__.py)."""
    modules = {}
    for folder, package in PACKAGES.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = path.relative_to(ROOT / folder).with_suffix("").parts
            modules[".".join((package, *parts[: -1 if parts[-1] == "__init__" else None]))] = path
    return modules


def _from_base(module: str, path: Path, node: ast.ImportFrom) -> str:
    """The package or module a `from ... import` reads from, relative levels resolved."""
    if not node.level:
        return node.module
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    return ".".join(package[: len(package) - node.level + 1] + ([node.module] if node.module else []))


@functools.cache
def _references(module: str) -> tuple[Reference, ...]:
    path = _modules()[module]
    refs = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            refs += [Reference(module, alias.name, path, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _from_base(module, path, node)
            refs += [
                Reference(module, base if alias.name == "*" else f"{base}.{alias.name}", path, node.lineno)
                for alias in node.names
            ]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("hone."):
            refs.append(Reference(module, node.value, path, node.lineno, string=True))
    return tuple(refs)


def _references_from(folder: str) -> list[Reference]:
    return [
        ref for module, path in _modules().items() if path.is_relative_to(ROOT / folder) for ref in _references(module)
    ]


def _names(target: str, *packages: str) -> bool:
    """`target` is (or starts with) one of these dotted names: "hone.app" covers "hone.app.main:main", not
    "hone.apps"."""
    return any(re.match(rf"{re.escape(package)}(?!\w)", target) for package in packages)


def test_kernels_refer_only_to_torch_and_triton():
    """Not even lazily or by name: kernels never reach into core or the app."""
    bad = [
        str(ref)
        for ref in _references_from("kernels")
        if _names(ref.target, "hone.core", "hone.app") or (not ref.string and _names(ref.target, *QT))
    ]
    assert not bad, bad


def test_core_refers_to_no_app_and_imports_no_qt():
    """Not even lazily or by name: the CLI finds `hone studio` through the `hone.commands` entry point group."""
    bad = [
        str(ref)
        for ref in _references_from("core")
        if _names(ref.target, "hone.app") or (not ref.string and _names(ref.target, *QT))
    ]
    assert not bad, bad


def _edges() -> dict[str, dict[str, Reference]]:
    """module -> {module it depends on: the first reference that says so}.

    An import depends on the module it names: `import hone.a.b` and `from hone.a.b import f` on hone.a.b,
    `from hone.a import b` on the submodule hone.a.b (not on hone.a's __init__; a package __init__ that re-exports
    has its own edges to the submodules it imports). A string literal depends on the module when it is exactly a
    module's name (what `importlib.import_module` and lazy-import tables hold). Imports inside functions and
    under `if TYPE_CHECKING:` count: a lazy import hides a circle from the interpreter, not from the design.
    """
    modules = _modules()
    edges: dict[str, dict[str, Reference]] = {module: {} for module in modules}
    for module in modules:
        for ref in _references(module):
            if ref.string:
                target = ref.target if ref.target in modules else None
            else:  # the longest prefix that is a module: "hone.a.b.f" -> hone.a.b
                parts = ref.target.split(".")
                target = next(
                    (name for name in (".".join(parts[:n]) for n in range(len(parts), 0, -1)) if name in modules), None
                )
            if target is not None and target != module:
                edges[module].setdefault(target, ref)
    return edges


# Core's folders from the bottom up (docs/architecture.md draws them). A module imports only from its own folder, from
# a folder on a lower line, or from the base line; folders sharing a line stay independent of one another. The base
# is core's loose modules and the two small stdlib-only folders every layer may read.
CORE_ORDER = (
    ("config", "control", "errors", "events", "model_info", "resources", "version", "machine", "install"),
    ("data",),
    ("vision",),
    ("models",),
    ("speed",),
    ("memory",),
    ("train",),
    ("export", "inference", "bench", "demo"),
    ("hub",),
    ("api",),
    ("cli",),
)


def core_folder(module: str) -> str | None:
    """ "hone.core.speed.moe.choice" -> "speed"; a loose module names itself; None outside hone.core."""
    parts = module.split(".")
    return parts[2] if parts[:2] == ["hone", "core"] and len(parts) > 2 else None


def _line_of(folder: str) -> int:
    line = next((n for n, names in enumerate(CORE_ORDER) if folder in names), None)
    assert line is not None, f"hone.core.{folder} is in no line of CORE_ORDER (tests/test_layering.py): add it"
    return line


def _backward_imports(edges: dict[str, dict[str, Reference]]) -> list[str]:
    bad = []
    for source, targets in edges.items():
        here = core_folder(source)
        for target, ref in targets.items():
            there = core_folder(target)
            # A string naming a module is a process boundary here (`python -m hone.core.cli train`), not an import.
            if ref.string or here is None or there is None or here == there or _line_of(there) == 0:
                continue
            if _line_of(there) >= _line_of(here):
                bad.append(f"{ref}  (hone.core.{here} may not import hone.core.{there})")
    return bad


def test_core_folders_import_only_downwards():
    bad = _backward_imports(_edges())
    assert not bad, "imports against core's folder order (CORE_ORDER):\n" + "\n".join(bad)


def test_folder_order_check_names_a_backward_import():
    here = Path(__file__)
    up = Reference("hone.core.data.collate", "hone.core.speed.checkpointing", here, 1)
    sideways = Reference("hone.core.bench.run", "hone.core.export.adapter", here, 2)
    down = Reference("hone.core.train.step", "hone.core.data.collate", here, 3)
    base = Reference("hone.core.config", "hone.core.errors", here, 4)
    edges = {
        "hone.core.data.collate": {"hone.core.speed.checkpointing": up},
        "hone.core.bench.run": {"hone.core.export.adapter": sideways},
        "hone.core.train.step": {"hone.core.data.collate": down},
        "hone.core.config": {"hone.core.errors": base},
    }
    bad = _backward_imports(edges)
    assert len(bad) == 2
    assert "hone.core.data may not import hone.core.speed" in bad[0]
    assert "hone.core.bench may not import hone.core.export" in bad[1]


def _strongly_connected(edges: dict[str, dict[str, Reference]]) -> list[list[str]]:
    """Tarjan's algorithm: the sets of modules that each reach one another (more than one module)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for succ in edges[node]:
            if succ not in index:
                visit(succ)
                low[node] = min(low[node], low[succ])
            elif succ in on_stack:
                low[node] = min(low[node], index[succ])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return sorted(found)


def _one_circle(component: list[str], edges: dict[str, dict[str, Reference]]) -> list[Reference]:
    """The shortest circle from the component's first module back to itself, as the references along it."""
    start, members = component[0], set(component)
    came_from: dict[str, Reference] = {}
    queue = deque([start])
    while queue:
        node = queue.popleft()
        for succ, ref in edges[node].items():
            if succ == start:
                path = [ref]
                while path[0].source != start:
                    path.insert(0, came_from[path[0].source])
                return path
            if succ in members and succ not in came_from:
                came_from[succ] = ref
                queue.append(succ)
    raise AssertionError(f"{component} is not strongly connected")


def _circle_report(edges: dict[str, dict[str, Reference]]) -> list[str]:
    report = []
    for component in _strongly_connected(edges):
        circle = _one_circle(component, edges)
        report.append(f"circle among {', '.join(component)}:")
        report += [
            f"    {ref.source} -> {to}  ({ref})"
            for ref, to in zip(circle, [r.source for r in circle[1:]] + [component[0]])
        ]
    return report


def test_no_import_circles_among_hone_modules():
    report = _circle_report(_edges())
    assert not report, "import circles (each listed with one path around it):\n" + "\n".join(report)


def test_circle_finder_finds_a_lazy_circle_and_names_its_modules():
    """The finder itself, on a made-up graph: a <-> b through a lazy import, c on its own."""
    here = Path(__file__)
    a_to_b = Reference("hone.x.a", "hone.x.b.f", here, 1)
    b_to_a = Reference("hone.x.b", "hone.x.a", here, 2)
    edges = {
        "hone.x.a": {"hone.x.b": a_to_b},
        "hone.x.b": {"hone.x.a": b_to_a},
        "hone.x.c": {"hone.x.a": Reference("hone.x.c", "hone.x.a", here, 3)},
    }
    assert _strongly_connected(edges) == [["hone.x.a", "hone.x.b"]]
    assert _one_circle(["hone.x.a", "hone.x.b"], edges) == [a_to_b, b_to_a]
    assert _circle_report(edges)[0] == "circle among hone.x.a, hone.x.b:"


def test_app_imports_no_torch_at_module_level():
    """torch may be imported inside functions (after the user picks a model), never at module level."""
    bad = []
    for path in (ROOT / "app").rglob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in tree.body:
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            bad += [
                f"{path.relative_to(ROOT)}: {n}"
                for n in names
                if n.split(".")[0] in ("torch", "transformers", "peft", "triton", "bitsandbytes")
            ]
    assert not bad, bad


def _modules_after_import(code: str) -> set[str]:
    out = subprocess.run(
        [sys.executable, "-c", f"{code}\nimport sys; print(' '.join(sys.modules))"],
        capture_output=True,
        text=True,
        check=True,
        env={"QT_QPA_PLATFORM": "offscreen", "PATH": "", "HF_HUB_OFFLINE": "1"},
    )
    return set(out.stdout.split())


def test_light_core_modules_import_neither_torch_nor_qt():
    loaded = _modules_after_import("import hone.core.config, hone.core.events, hone.core.control, hone.core.cli")
    assert "torch" not in loaded
    assert not loaded & set(QT)


def test_gui_package_imports_without_torch():
    mods = sorted(
        f"hone.app.{p.relative_to(ROOT / 'app').with_suffix('').as_posix().replace('/', '.')}"
        for p in (ROOT / "app").rglob("*.py")
        if p.name != "__init__.py"
    )
    loaded = _modules_after_import("\n".join(["import hone.app"] + [f"import {m}" for m in mods]))
    assert "torch" not in loaded


# The door into the engine for the Studio and the CLI (docs/architecture.md, "Import rules"): hone.core.api, plus the
# base modules every layer reads.
DOOR = "hone.core.api"
DOOR_BASE = tuple(
    f"hone.core.{name}" for name in ("config", "control", "errors", "events", "model_info", "resources", "version")
)


def _past_the_door(refs: list[Reference], own: str | None = None) -> list[str]:
    """The references among `refs` that reach hone.core other than through the door, the base modules or the
    package `own` (the CLI's own modules): imports, and strings that name a module (`importlib.import_module`)."""
    modules = _modules()
    allowed = (DOOR, *DOOR_BASE, *((own,) if own else ()))
    return [
        str(ref)
        for ref in refs
        if _names(ref.target, "hone.core")
        and (not ref.string or ref.target in modules)
        and not _names(ref.target, *allowed)
    ]


def test_app_and_cli_reach_the_engine_only_through_hone_core_api():
    bad = _past_the_door(_references_from("app")) + _past_the_door(_references_from("core/cli"), own="hone.core.cli")
    assert not bad, (
        "imports of hone.core that pass by hone.core.api and the base modules (offer it in core/api/):\n"
        + "\n".join(bad)
    )


def test_door_check_names_each_import_past_the_door():
    here = Path(__file__)
    refs = [
        Reference("hone.app.pages.train", "hone.core.memory.run_plan.plan_run", here, 1),  # past the door
        Reference("hone.app.pages.train", "hone.core.api.plan_run", here, 2),
        Reference("hone.app.workers", "hone.core.api.child_run.train_in_child", here, 3),
        Reference("hone.app.pages.train", "hone.core.config.RunConfig", here, 4),
        Reference("hone.app.pages.train", "hone.core.configuration", here, 5),  # not the base module config
        Reference("hone.app.pages.chat", "hone.core.train.run_dir", here, 6, string=True),  # import_module's name
        Reference("hone.app.pages.chat", "hone.core.train.child_run says why", here, 7, string=True),  # words
        Reference("hone.app.pages.model", "hone.core.machine.telemetry.Telemetry", here, 8),  # base of core, not here
    ]
    assert _past_the_door(refs) == [str(refs[0]), str(refs[4]), str(refs[5]), str(refs[7])]
    cli = [
        Reference("hone.core.cli.commands.train", "hone.core.cli.launch", here, 9),
        Reference("hone.core.cli.commands.train", "hone.core.train.trainer.Trainer", here, 10),
    ]
    assert _past_the_door(cli, own="hone.core.cli") == [str(cli[1])]


def test_the_door_imports_neither_torch_nor_qt():
    """Every submodule of hone.core.api imports light, so a Studio page may import any of its names at module level
    (the names whose engine module needs torch load it on first use)."""
    submodules = sorted(
        f"hone.core.api.{path.stem}" for path in (ROOT / "core" / "api").glob("*.py") if path.name != "__init__.py"
    )
    loaded = _modules_after_import("\n".join(["import hone.core.api"] + [f"import {m}" for m in submodules]))
    assert "torch" not in loaded and "transformers" not in loaded
    assert not loaded & set(QT)
