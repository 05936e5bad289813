"""`python -m hone.core.install plan|apply|check`: the installers' steps, runnable by hand as well.

plan [--cpu] [--json]      what this machine gets (PyTorch build, notes, or why it cannot be installed)
apply --uv UV --venv VENV --wheel WHEEL [--constraints FILE] [--log FILE] [--cpu] [--wheels DIR]
check                      whether the installed PyTorch works on this machine (exit 1 when it does not)
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

from hone.core.install.environment import apply
from hone.core.install.machine import probe_machine
from hone.core.install.plan import plan_install
from hone.core.install.runtime import ERROR, check_runtime


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hone.core.install", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="step", required=True)
    plan = sub.add_parser("plan", help="print what this machine gets")
    plan.add_argument("--cpu", action="store_true", help="the CPU build, whatever GPU there is")
    plan.add_argument("--json", action="store_true", help="print the machine and the plan as JSON")
    step = sub.add_parser("apply", help="install Hone and PyTorch into a venv with uv")
    step.add_argument("--uv", type=Path, required=True, help="the uv executable")
    step.add_argument("--venv", type=Path, required=True, help="the venv to install into (created beforehand)")
    step.add_argument("--wheel", type=Path, required=True, help="Hone Studio's wheel")
    step.add_argument("--constraints", type=Path, help="pins of the tested versions")
    step.add_argument("--log", type=Path, help="append everything printed to this file")
    step.add_argument("--cpu", action="store_true", help="the CPU build, whatever GPU there is")
    step.add_argument("--wheels", type=Path, help="a folder of wheels to use first (torch's build included)")
    sub.add_parser("check", help="does the installed PyTorch work here?")
    args = parser.parse_args(argv)

    if args.step == "plan":
        machine = probe_machine()
        chosen = plan_install(machine, cpu=args.cpu)
        if args.json:
            print(json.dumps({"machine": dataclasses.asdict(machine), "plan": dataclasses.asdict(chosen)}, indent=2))
        else:
            print(chosen.describe())
        return 3 if chosen.error else 0
    if args.step == "apply":
        return apply(
            uv=args.uv,
            venv=args.venv,
            wheel=args.wheel,
            constraints=args.constraints,
            log_path=args.log,
            cpu=args.cpu,
            wheels=args.wheels,
        )
    findings = check_runtime()
    for finding in findings:
        print(f"{finding.level.upper()}: {finding.title}")
        for extra in (finding.fix, finding.detail):
            if extra:
                print(f"    {extra}")
    return 1 if any(finding.level == ERROR for finding in findings) else 0


if __name__ == "__main__":
    sys.exit(main())
