"""Silent phases made visible (hone.core.cli.console.Phase, convert_gguf_once) and `hone data check --model`'s
progress lines on a non-terminal."""

from __future__ import annotations

import io
import json
import os
import struct
import subprocess
import sys

from rich.console import Console

from hone.core.cli import console as console_module
from hone.core.cli.console import Phase, convert_gguf_once
from hone.core.config import ModelConfig


def _plain_console() -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    return Console(file=out, force_terminal=False, width=200), out


def test_plain_phase_says_what_it_does_the_count_and_done_once(monkeypatch):
    clock = iter([0.0, 5.0, 40.0, 41.0, 100.0, 130.0])
    monkeypatch.setattr(console_module.time, "monotonic", lambda: next(clock))
    console, out = _plain_console()
    with Phase(console, "scoring the base model on 40 held-out rows", total=40, unit="rows scored") as phase:
        phase.update(10)  # 5 s after the start: too soon for a line
        phase.update(20)  # 40 s: a line
        phase.update(30)  # 41 s: too soon
        phase.update(40)  # the last count goes on the done line
    assert out.getvalue().splitlines() == [
        "scoring the base model on 40 held-out rows ...",
        "  20/40 rows scored",
        "scoring the base model on 40 held-out rows: 40 rows scored, done in 130 s",
    ]


def test_phase_that_fails_does_not_say_done():
    console, out = _plain_console()
    try:
        with Phase(console, "converting x"):
            raise ValueError("unreadable")
    except ValueError:
        pass
    assert out.getvalue().splitlines() == ["converting x ..."]


def test_terminal_phase_draws_no_plain_lines_and_says_done_once():
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=200)
    with Phase(console, "tokenizing", unit="rows") as phase:
        phase.update(7)
    text = out.getvalue()
    assert "tokenizing ..." not in text and text.count("tokenizing: 7 rows, done in 0 s") == 1


def test_gguf_conversion_is_announced_only_the_first_time(tmp_path, monkeypatch):
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, 0))  # a whole GGUF v3 file: no tensors, no metadata
    converted = tmp_path / "converted"
    calls = []

    def convert(path):
        calls.append(path)
        converted.mkdir()
        (converted / "config.json").write_text("{}")
        return converted

    import hone.core.api.models as door
    import hone.core.models.load as load

    # the console converts through the door (hone.core.api); pending_conversion reads the loader's own name
    for module in (load, door):
        monkeypatch.setattr(module, "gguf_conversion_folder", lambda path: converted)
    monkeypatch.setattr(door, "gguf_folder", convert)
    console, out = _plain_console()
    convert_gguf_once(ModelConfig(name_or_path=str(gguf)), console)
    convert_gguf_once(ModelConfig(name_or_path=str(gguf)), console)
    lines = out.getvalue().splitlines()
    assert calls == [gguf.resolve()] and len(lines) == 2
    assert lines[0].startswith(f"converting {gguf} from GGUF to safetensors (first use only")
    assert lines[1].endswith("done in 0 s")


def test_data_check_with_model_prints_progress_lines_off_a_terminal(tmp_path, smollm2_tokenizer_dir):
    rows = [
        {"messages": [{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": "a"}]} for i in range(3)
    ]
    (tmp_path / "a.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "hone.core.cli",
            "data",
            "check",
            "a.jsonl",
            "--model",
            str(smollm2_tokenizer_dir),
            "--json",
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "HONE_CACHE": str(tmp_path / "cache")},
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["rows_kept"] == 3  # stdout stays the report alone
    lines = out.stderr.strip().splitlines()
    assert lines[0] == f"loading the tokenizer of {smollm2_tokenizer_dir} ..."
    assert lines[1].startswith(f"loading the tokenizer of {smollm2_tokenizer_dir}: done in ")
    assert lines[2] == f"tokenizing every row with the chat template of {smollm2_tokenizer_dir} ..."
    assert lines[3].startswith(
        f"tokenizing every row with the chat template of {smollm2_tokenizer_dir}: 3 rows, done in "
    )
    assert len(lines) == 4, out.stderr
