"""The dependency direction app -> core -> kernels holds, and the light modules stay light."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
QT = ("PySide6", "pyqtgraph", "shiboken6")


def _imports(folder: str):
    for path in (ROOT / folder).rglob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    yield path, alias.name, node
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                yield path, node.module, node


def test_kernels_import_only_torch_and_triton():
    bad = [f"{p.relative_to(ROOT)}: {m}" for p, m, _ in _imports("kernels")
           if m.startswith(("hone.core", "hone.app", *QT))]
    assert not bad, bad


def test_core_imports_no_qt_and_no_app():
    bad = [f"{p.relative_to(ROOT)}: {m}" for p, m, _ in _imports("core") if m.startswith(("hone.app", *QT))]
    assert not bad, bad


def test_app_imports_no_torch_at_module_level():
    """torch may be imported inside functions (after the user picks a model), never at module level."""
    bad = []
    for path in (ROOT / "app").rglob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in tree.body:
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            bad += [f"{path.relative_to(ROOT)}: {n}" for n in names
                    if n.split(".")[0] in ("torch", "transformers", "peft", "triton", "bitsandbytes")]
    assert not bad, bad


def _modules_after_import(code: str) -> set[str]:
    out = subprocess.run([sys.executable, "-c", f"{code}\nimport sys; print(' '.join(sys.modules))"],
                         capture_output=True, text=True, check=True,
                         env={"QT_QPA_PLATFORM": "offscreen", "PATH": "", "HF_HUB_OFFLINE": "1"})
    return set(out.stdout.split())


def test_light_core_modules_import_neither_torch_nor_qt():
    loaded = _modules_after_import("import hone.core.config, hone.core.events, hone.core.control, hone.core.cli")
    assert "torch" not in loaded
    assert not loaded & set(QT)


def test_gui_package_imports_without_torch():
    mods = sorted(f"hone.app.{p.relative_to(ROOT / 'app').with_suffix('').as_posix().replace('/', '.')}"
                  for p in (ROOT / "app").rglob("*.py") if p.name != "__init__.py")
    loaded = _modules_after_import("\n".join(["import hone.app"] + [f"import {m}" for m in mods]))
    assert "torch" not in loaded
