"""Check that the installers' pins (installers/constraints.txt) are the versions a test environment just passed on.

    python3 tools/check_constraints.py PYTHON [--newest PYTHON] [--constraints FILE]

PYTHON is the interpreter of the environment the pinned stack was tested in. Every pin whose marker applies to this
machine must be installed there at exactly the pinned version; pins for other platforms (triton-windows) are listed
as not checked here. Exit 1 with the list of mismatches, else 0. With --newest, the interpreter of the environment
with the newest releases: pins older than what it passed on are listed too, as candidates to raise (not an error).
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

from packaging.markers import Marker
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]
_PIN = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*==\s*([^\s;]+)\s*(?:;\s*(.+?))?\s*$")
_VERSIONS = (
    "import importlib.metadata as m, json\n"
    "print(json.dumps({d.metadata['Name']: d.version for d in m.distributions() if d.metadata['Name']}))"
)


def read_pins(path: Path) -> list[tuple[str, str, str | None]]:
    """(name, version, marker or None) for each `name==version[ ; marker]` line; comments and blanks skipped."""
    pins = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        text = line.split("#", 1)[0].strip()
        if not text:
            continue
        match = _PIN.match(text)
        if match is None:
            raise SystemExit(f"{path}:{number}: not a `name==version` pin: {line.strip()!r}")
        pins.append((canonicalize_name(match.group(1)), match.group(2), match.group(3)))
    return pins


def installed_versions(python: str) -> dict[str, str]:
    """Distribution name (canonical) -> version in the environment of the interpreter `python`."""
    out = subprocess.run([python, "-c", _VERSIONS], capture_output=True, text=True, check=True, timeout=120).stdout
    return {canonicalize_name(name): version for name, version in json.loads(out).items()}


def mismatches(pins, tested: dict[str, str]) -> tuple[list[str], list[str]]:
    """(mismatch lines, pins for other platforms) of `pins` against the `tested` versions."""
    wrong, elsewhere = [], []
    for name, version, marker in pins:
        if marker and not Marker(marker).evaluate():
            elsewhere.append(f"{name}=={version} ({marker})")
        elif name not in tested:
            wrong.append(f"{name}: pinned {version}, not installed in the tested environment")
        elif tested[name] != version:
            wrong.append(f"{name}: pinned {version}, tested {tested[name]}")
    return wrong, elsewhere


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("python", help="the interpreter of the environment the pinned stack was tested in")
    parser.add_argument("--newest", help="the interpreter of the environment with the newest releases")
    parser.add_argument("--constraints", type=Path, default=ROOT / "installers" / "constraints.txt")
    args = parser.parse_args(argv)
    pins = read_pins(args.constraints)
    wrong, elsewhere = mismatches(pins, installed_versions(args.python))
    if args.newest:
        newest = installed_versions(args.newest)
        behind = [
            f"{name}: pinned {version}, newest tested {newest[name]}"
            for name, version, marker in pins
            if name in newest and newest[name] != version and (not marker or Marker(marker).evaluate())
        ]
        if behind:
            print("Pins older than the newest releases the suite passed on (raise them once the GPU suite passes):")
            print("".join(f"  {line}\n" for line in behind), end="")
    if elsewhere:
        print(f"Not checked on this platform: {', '.join(elsewhere)}")
    if wrong:
        print(
            f"{args.constraints.relative_to(ROOT) if args.constraints.is_relative_to(ROOT) else args.constraints}: "
            f"{len(wrong)} pin(s) differ from the versions the tests passed on; installers must install what was "
            "tested:",
            file=sys.stderr,
        )
        print("".join(f"  {line}\n" for line in wrong), end="", file=sys.stderr)
        return 1
    print(f"{len(pins) - len(elsewhere)} pins match the tested environment.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
