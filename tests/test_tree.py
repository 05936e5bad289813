"""The tree tells the architecture: few loose modules in core, and package `__init__.py` files that only say what
the package holds and re-export it (eagerly, or lazily through a module `__getattr__`)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAX_LOOSE_CORE_MODULES = 10
# What a re-exporting __init__ may hold besides imports and a docstring: its export list, a lazy-import table, and
# the module __getattr__ / __dir__ that read the table.
ALLOWED_NAMES = {"__all__", "_LAZY", "_HOME"}
ALLOWED_FUNCTIONS = {"__getattr__", "__dir__"}


def _what_is_not_a_re_export(path: Path) -> list[str]:
    """`file:line: statement` for each statement of an __init__.py that is not part of re-exporting."""
    shown = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
    found = []
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            continue
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):  # the docstring
            continue
        if isinstance(node, ast.FunctionDef) and node.name in ALLOWED_FUNCTIONS:
            continue
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if all(isinstance(t, ast.Name) and t.id in ALLOWED_NAMES for t in targets):
                continue
        found.append(f"{shown}:{node.lineno}: {ast.unparse(node).splitlines()[0]}")
    return found


def test_package_init_files_only_re_export():
    bad = [line for folder in ("app", "core", "kernels") for path in sorted((ROOT / folder).rglob("__init__.py"))
           for line in _what_is_not_a_re_export(path)]  # fmt: skip
    assert not bad, "code in __init__.py (move it to a module of the package):\n" + "\n".join(bad)


def test_the_re_export_check_names_code_and_passes_lazy_re_exports(tmp_path):
    init = tmp_path / "__init__.py"
    init.write_text(
        '"""A package."""\n'
        "import importlib\n"
        "from x import y\n"
        '__all__ = ["y", "z"]\n'
        '_LAZY = {"z": "x.z"}\n'
        "def __getattr__(name):\n"
        "    return getattr(importlib.import_module(_LAZY[name]), name)\n"
        "def helper():\n"
        "    return 1\n"
        "CACHE = {}\n"
    )
    assert _what_is_not_a_re_export(init) == [f"{init}:8: def helper():", f"{init}:10: CACHE = {{}}"]


def test_core_keeps_few_loose_modules():
    loose = sorted(p.name for p in (ROOT / "core").glob("*.py"))
    assert len(loose) <= MAX_LOOSE_CORE_MODULES, f"{len(loose)} modules directly in core/ (group them): {loose}"
