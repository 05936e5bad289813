"""Machines check what memory used to: CI runs ruff's lint and format and mypy before the slow tests, the pre-commit
hooks run the same three, and mypy finds the hone.core modules pyproject.toml names through the link to core/."""

from __future__ import annotations

import re
import shlex
import sys
from pathlib import Path

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
CHECKS = [("ruff", "check"), ("ruff", "format"), ("mypy",)]


def _tool(words: list[str]) -> tuple[str, ...]:
    """The tool and, for ruff, its subcommand: `python3 -m ruff check .` -> ("ruff", "check")."""
    if words[:2] == ["python3", "-m"]:
        words = words[2:]
    return tuple(words[:2]) if words[0] == "ruff" else (words[0],)


def test_ci_runs_lint_format_and_types_before_the_slow_tests():
    lines = [line.strip() for line in (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()]
    checks = ["python3 -m ruff check .", "python3 -m ruff format --check .", "python3 -m mypy"]
    missing = [c for c in checks if c not in lines]
    assert not missing, f".ci/run does not run {missing}"
    install = lines.index('python3 -m pip install -e ".[dev]"')
    first_tests = next(i for i, line in enumerate(lines) if "pytest" in line and not line.startswith("#"))
    assert all(install < lines.index(c) < first_tests for c in checks), "the checks run after the dev install and first"


def test_pre_commit_runs_the_ci_checks_with_pyprojects_settings():
    yaml = pytest.importorskip("yaml")
    config = yaml.safe_load((ROOT / ".pre-commit-config.yaml").read_text(encoding="utf-8"))
    hooks = [hook for repo in config["repos"] for hook in repo["hooks"]]
    assert [_tool(shlex.split(hook["entry"])) for hook in hooks] == CHECKS
    assert all(hook["language"] == "system" for hook in hooks), "the dev extra's versions, as in CI"
    mypy = hooks[2]
    # Given file names, mypy would check those files (under other module names) instead of pyproject's list.
    assert mypy.get("pass_filenames") is False and "args" not in mypy
    for changed in ("core/config.py", "core/data/formats.py", "core/memory/fit.py", "pyproject.toml"):
        assert re.search(mypy["files"], changed), f"changing {changed} does not run mypy"


def test_mypy_finds_each_listed_module_through_the_link_to_core():
    settings = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["mypy"]
    link = ROOT / settings["mypy_path"] / "hone" / "core"
    assert link.resolve() == (ROOT / "core").resolve(), f"{link} must be a link to core/ (git: core.symlinks)"
    for package in settings["packages"]:
        where = link.joinpath(*package.split(".")[2:])
        assert where.is_dir() or where.with_suffix(".py").is_file(), f"[tool.mypy] packages: {package} is not in core/"
