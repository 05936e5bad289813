"""The installers' pins: tools/check_constraints.py finds every pin that differs from a tested environment, and the
pinned stack is the oldest that pyproject.toml supports (the one .ci/run tests besides the newest releases)."""

from __future__ import annotations

import re
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
CHECK = ROOT / "tools" / "check_constraints.py"


def check(tmp_path, lines: list[str], *newest: str):
    pins = tmp_path / "constraints.txt"
    pins.write_text("# pins\n" + "\n".join(lines) + "\n")
    args = [sys.executable, str(CHECK), sys.executable, "--constraints", str(pins)]
    if newest:
        args += ["--newest", *newest]
    return subprocess.run(args, capture_output=True, text=True, timeout=120)


def test_pins_of_the_tested_versions_pass(tmp_path):
    done = check(
        tmp_path,
        [
            f"pytest=={version('pytest')}",
            f"Packaging == {version('packaging')}",
            'not-a-package==1.0 ; sys_platform == "no-such-platform"',
        ],
        sys.executable,
    )
    assert done.returncode == 0, done.stderr
    assert "2 pins match" in done.stdout and "not-a-package==1.0" in done.stdout  # listed as not checked here


def test_each_mismatch_is_listed_and_fails(tmp_path):
    done = check(tmp_path, [f"pytest=={version('pytest')}", "packaging==0.0.1", "not-a-package==1.0"])
    assert done.returncode == 1
    assert f"packaging: pinned 0.0.1, tested {version('packaging')}" in done.stderr
    assert "not-a-package: pinned 1.0, not installed in the tested environment" in done.stderr
    assert not any(line.strip().startswith("pytest:") for line in done.stderr.splitlines())


def test_a_line_that_is_not_a_pin_is_refused_with_its_place(tmp_path):
    done = check(tmp_path, ["torch>=2.11"])
    assert done.returncode != 0 and "constraints.txt:2: not a `name==version` pin" in done.stderr


def floors() -> dict[str, str]:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    return {m.group(1).lower(): m.group(2) for d in deps if (m := re.match(r"([\w.-]+)>=([\w.]+)", d))}


def test_the_installers_pin_the_oldest_transformers_and_peft_pyproject_supports():
    """.ci/run tests the pinned stack as the oldest end: transformers and peft there are pyproject's lower bounds."""
    pins = dict(re.findall(r"^([\w.-]+)==([\w.]+)", (ROOT / "installers" / "constraints.txt").read_text(), re.M))
    for name in ("transformers", "peft"):
        floor = floors()[name]
        assert re.fullmatch(rf"{re.escape(floor)}(\.0)*", pins[name]), f"{name}=={pins[name]} is not {floor}"
