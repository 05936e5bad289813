"""Hostile configs given to `hone train` as users give them (a TOML file, --set): every bad number and every run
name that is not one plain folder name ends at once with exit 2, one error line naming the field and one line of
advice, no traceback, and nothing written anywhere: no run folder, nothing outside output.runs_dir."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

# Longer than `hone train`'s own start (Python, rich, the config and the file checks: well under a second on an idle
# machine) with room for a loaded CI machine, and far shorter than loading torch and a model (10-40 s).
FAST_S = 6.0


def _train(tmp_path, settings: str = "", *overrides: str, raw: bytes | None = None):
    """`hone train` on a config holding `settings` (TOML lines) or the bytes `raw`, plus --set `overrides`."""
    runs = (tmp_path / "work" / "runs").as_posix()
    config = tmp_path / "work" / "run.toml"
    config.parent.mkdir()
    config.write_bytes(raw if raw is not None else f'[output]\nruns_dir = "{runs}"\n{settings}\n'.encode())
    args = [sys.executable, "-m", "hone.core.cli", "train", str(config)]
    for override in overrides:
        args += ["--set", override]
    start = time.monotonic()
    out = subprocess.run(
        args,
        capture_output=True,
        text=True,
        cwd=tmp_path / "work",
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
        timeout=120,
    )
    return out, time.monotonic() - start


def _assert_refused_at_once(tmp_path, out, elapsed, message: str, advice: str) -> None:
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 2 and "Traceback" not in out.stderr, out.stderr
    assert lines[0].startswith("hone: error: ") and message in lines[0], out.stderr
    assert lines[1].startswith("hone: advice: ") and advice in lines[1], out.stderr
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["run.toml", "work"], "nothing may be written"
    assert elapsed < FAST_S, f"took {elapsed:.1f} s"


# (TOML lines after the config file's [output] table, the error's words, the advice's words)
BAD_VALUES = [
    (
        "[train]\nepochs = inf",
        "train.epochs is inf, which is not a finite number",
        "set train.epochs to a number between 0.0 and 1000.0",
    ),
    ("[train]\nepochs = nan", "train.epochs is nan, which is not a finite number", "train.epochs"),
    (
        "[train]\nseed = 18446744073709551616",
        "train.seed is 1.84e+19, above its maximum 2147483647",
        "set train.seed to at most 2147483647",
    ),
    (
        "[train]\nmax_steps = 1e23",
        "train.max_steps is 1e+23, above its maximum 10000000",
        "set train.max_steps to at most 10000000",
    ),
    ("[train]\nmax_steps = 12.5", "train.max_steps is 12.5, which is not a valid int", "give train.max_steps an int"),
    (
        "[train]\nbatch_tokens = 1e12",
        "train.batch_tokens is 1000000000000, above its maximum 4194304",
        "set train.batch_tokens to at most 4194304",
    ),
    ("[train]\nlr = nan", "train.lr is nan, which is not a finite number", "train.lr"),
    ("[train]\nlr = 0.0", "train.lr is 0.0, not above its minimum 0.0", "set train.lr to a value above 0.0"),
    ("[train]\ngrad_accum = 0", "train.grad_accum is 0, below its minimum 1", "set train.grad_accum to at least 1"),
    ("[lora]\nalpha = inf", "lora.alpha is inf, which is not a finite number", "lora.alpha"),
    ("[lora]\nalpha = -16.0", "lora.alpha is -16.0, not above its minimum 0.0", "lora.alpha"),
    ("[data]\nmax_length = 1e9", "data.max_length is 1000000000, above its maximum 1048576", "data.max_length"),
    ("keep_checkpoints = 0", "output.keep_checkpoints is 0, below its minimum 1", "output.keep_checkpoints"),
]


@pytest.mark.parametrize("settings, message, advice", BAD_VALUES, ids=[b[0].split("\n")[-1] for b in BAD_VALUES])
def test_a_bad_number_in_the_config_file_exits_2_naming_the_field(tmp_path, settings, message, advice):
    out, elapsed = _train(tmp_path, settings)
    _assert_refused_at_once(tmp_path, out, elapsed, message, advice)


@pytest.mark.parametrize(
    "override, message",
    [
        ("train.epochs=inf", "train.epochs is inf, which is not a finite number"),
        ("lora.alpha=nan", "lora.alpha is nan, which is not a finite number"),
        ("train.seed=-1", "train.seed is -1, below its minimum 0"),
    ],
)
def test_a_bad_number_given_with_set_exits_2_naming_the_field(tmp_path, override, message):
    out, elapsed = _train(tmp_path, "", override)
    _assert_refused_at_once(tmp_path, out, elapsed, message, override.split("=")[0])


BAD_NAMES = ["../../x", "../escaped", "/tmp/elsewhere", "a/b", "run\nPARAMETER temperature 99", "..", "x" * 200]


@pytest.mark.parametrize("name", BAD_NAMES, ids=repr)
def test_a_run_name_that_would_leave_runs_dir_or_inject_lines_exits_2(tmp_path, name):
    escaped = name.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    out, elapsed = _train(tmp_path, f'name = "{escaped}"')  # in the [output] table of the file
    _assert_refused_at_once(tmp_path, out, elapsed, "output.name is ", "give output.name a plain name")


def test_a_config_file_that_is_not_utf8_names_the_file_and_byte(tmp_path):
    raw = "[train]\n# réglages d'entraînement\nlr = 1e-4\n".encode("cp1252")
    out, elapsed = _train(tmp_path, raw=raw)
    offset = raw.index(b"\xe9")
    _assert_refused_at_once(
        tmp_path,
        out,
        elapsed,
        f"run.toml is not UTF-8 text: byte 0xe9 at offset {offset} (line 2)",
        "save the file as UTF-8",
    )
