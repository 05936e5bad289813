"""Damaged files and unwritable folders given to the `hone` commands as users give them: a .gguf cut short (a download
that stopped) to `hone data check --model` and `hone train`, a cut or garbled adapter to `hone export`, and an
export into a read-only folder. Each ends at once with exit 2, an error line naming the file or folder and what is
wrong with it (sizes where the file states them), a line of advice, no traceback, and nothing written."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest

from hone.core.config import RunConfig
from hone.core.resources import smollm2_gguf

# Longer than the commands' own start (Python, rich, the file checks: well under a second on an idle machine) with
# room for a loaded CI machine, and far shorter than loading torch and a model (10-40 s).
FAST_S = 8.0
ROW = {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."}]}


def _hone(*args: str, cwd, prefix: tuple[str, ...] = ()):
    start = time.monotonic()
    out = subprocess.run(
        [*prefix, sys.executable, "-m", "hone.core.cli", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
        timeout=120,
    )
    return out, time.monotonic() - start


def _assert_refused_at_once(out, elapsed, message: str, advice: str) -> None:
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert "Traceback" not in out.stderr, out.stderr
    assert lines[-2].startswith("hone: error: ") and message in lines[-2], out.stderr
    assert lines[-1].startswith("hone: advice: ") and advice in lines[-1], out.stderr
    assert elapsed < FAST_S, f"took {elapsed:.1f} s"


@pytest.fixture
def cut_ggufs(tmp_path):
    """The bundled SmolLM2 GGUF cut in its weights (header whole) and cut inside its header."""
    whole = smollm2_gguf().read_bytes()[:2_000_000]
    data = tmp_path / "data.jsonl"
    data.write_text(json.dumps(ROW) + "\n", encoding="utf-8")
    in_weights, in_header = tmp_path / "in-weights.gguf", tmp_path / "in-header.gguf"
    in_weights.write_bytes(whole)
    in_header.write_bytes(whole[:1000])
    return data, in_weights, in_header


def test_data_check_with_a_cut_gguf_says_it_is_damaged(cut_ggufs, tmp_path):
    data, in_weights, in_header = cut_ggufs
    size = smollm2_gguf().stat().st_size
    out, elapsed = _hone("data", "check", str(data), "--model", str(in_weights), cwd=tmp_path)
    _assert_refused_at_once(
        out,
        elapsed,
        f"{in_weights} is damaged: it is cut short: it should have {size:,} bytes",
        "download or copy the file again",
    )
    assert f"but has 2,000,000 ({size - 2_000_000:,} missing)" in out.stderr
    assert "architecture" not in out.stderr
    out, elapsed = _hone("data", "check", str(data), "--model", str(in_header), cwd=tmp_path)
    _assert_refused_at_once(
        out,
        elapsed,
        f"{in_header} is damaged: it ends inside its GGUF header (the file has 1,000 bytes",
        "download or copy the file again",
    )


@pytest.mark.parametrize("which", ["in-weights", "in-header"])
def test_train_with_a_cut_gguf_says_it_is_damaged_and_writes_nothing(cut_ggufs, tmp_path, which):
    data, *_ = cut_ggufs
    config = tmp_path / "run.toml"
    runs = (tmp_path / "runs").as_posix()
    config.write_text(
        f'[model]\nname_or_path = "{(tmp_path / which).as_posix()}.gguf"\n'
        f'[data]\ntrain = ["{data.as_posix()}"]\n[output]\nruns_dir = "{runs}"\n',
        encoding="utf-8",
    )
    out, elapsed = _hone("train", str(config), cwd=tmp_path)
    _assert_refused_at_once(out, elapsed, f"{which}.gguf is damaged: it ", "download or copy the file again")
    assert "architecture" not in out.stderr
    assert not (tmp_path / "runs").exists()


def _run_folder(root):
    """A run folder as `hone train` leaves it, with a real (small) safetensors adapter and its config."""
    from safetensors.numpy import save_file

    run = root / "run"
    (run / "adapter").mkdir(parents=True)
    RunConfig().save(run / "config.toml")
    rng = np.random.default_rng(0)
    save_file(
        {
            f"base_model.model.model.layers.0.self_attn.q_proj.lora_{m}.weight": rng.standard_normal(
                (8, 64), dtype=np.float32
            )
            for m in "AB"
        },
        str(run / "adapter" / "adapter_model.safetensors"),
    )
    (run / "adapter" / "adapter_config.json").write_text(
        json.dumps(
            {
                "peft_type": "LORA",
                "r": 8,
                "lora_alpha": 16,
                "target_modules": ["q_proj"],
                "base_model_name_or_path": "bundled:smollm2-135m-instruct",
            }
        ),
        encoding="utf-8",
    )
    (run / "run.json").write_text(
        json.dumps({"run_dir": str(run), "name": "run", "model": "m", "status": "finished"}), encoding="utf-8"
    )
    return run


@pytest.mark.parametrize(
    "file, cut, words",
    [
        (
            "adapter_model.safetensors",
            0.5,
            "it is cut short: it should have {whole:,} bytes (to the end of the last of "
            "its 2 tensors) but has {size:,} ({missing:,} missing)",
        ),
        ("adapter_model.safetensors", 0.001, "it has {size} bytes, fewer than the 8 that give a safetensors header's"),
        ("adapter_config.json", 0.5, "it is not valid JSON (Unterminated string"),
    ],
)
def test_export_of_a_damaged_adapter_names_the_file(tmp_path, file, cut, words):
    run = _run_folder(tmp_path)
    path = run / "adapter" / file
    raw = path.read_bytes()
    size = int(len(raw) * cut)
    path.write_bytes(raw[:size])
    out, elapsed = _hone("export", str(run), "--format", "adapter", "--out", str(tmp_path / "out"), cwd=tmp_path)
    words = words.format(whole=len(raw), size=size, missing=len(raw) - size)
    _assert_refused_at_once(out, elapsed, f"{path} is damaged: {words}", f"hone train --resume {run}")
    assert not (tmp_path / "out").exists()


def _without_root_override() -> tuple[str, ...]:
    """A command prefix under which a read-only folder is read-only: root writes anywhere unless it drops
    CAP_DAC_OVERRIDE, which setpriv does for the command it starts."""
    if sys.platform == "win32":
        pytest.skip("a read-only folder on Windows is an ACL, not a mode")
    if os.geteuid() != 0:
        return ()
    if not shutil.which("setpriv"):
        pytest.skip("running as root without setpriv: a read-only folder cannot be made")
    return ("setpriv", "--bounding-set=-dac_override,-dac_read_search", "--")


@pytest.mark.parametrize("out_name", ["exports/adapter", "adapter"])
def test_export_into_a_read_only_folder_says_so(tmp_path, out_name):
    prefix = _without_root_override()
    run = _run_folder(tmp_path)
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o555)
    try:
        out, elapsed = _hone(
            "export", str(run), "--format", "adapter", "--out", str(locked / out_name), cwd=tmp_path, prefix=prefix
        )
    finally:
        locked.chmod(0o755)
    _assert_refused_at_once(
        out,
        elapsed,
        f"cannot write the export to {locked / out_name}: {locked} is read-only",
        "choose an --out folder you can write to",
    )
    assert list(locked.iterdir()) == []
