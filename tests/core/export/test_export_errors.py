"""Exports that cannot be done say why and what to do; existing output is never overwritten by accident; an
interrupted export leaves nothing behind."""

from __future__ import annotations

import json
import os
import socket

import pytest

from hone.core.config import ModelConfig, RunConfig
from hone.core.export import ExportError, export_run


def test_missing_folder_and_non_run_folder(tmp_path):
    with pytest.raises(ExportError, match="does not exist"):
        export_run(tmp_path / "nope", "adapter")
    with pytest.raises(ExportError, match="not a run folder"):
        export_run(tmp_path, "adapter")


@pytest.mark.parametrize(
    "status, live, advice",
    [
        ("running", True, "still training"),
        ("running", False, "the run was interrupted at step 0"),
        ("failed", False, "out of memory"),
        ("stopped", False, "hone train --resume"),
    ],
)
def test_run_without_adapter_says_so(tmp_path, status, live, advice):
    run = tmp_path / "run"
    run.mkdir()
    RunConfig(model=ModelConfig(name_or_path="some/model")).save(run / "config.toml")
    (run / "run.json").write_text(
        json.dumps(
            {"run_dir": str(run), "name": "run", "model": "some/model", "status": status, "reason": "out of memory"}
        )
    )
    if live:  # the lock note of a process that is alive: this one
        (run / "run.lock").write_text(json.dumps({"pid": os.getpid(), "host": socket.gethostname()}) + "\n")
    with pytest.raises(ExportError, match="has no adapter to export") as e:
        export_run(run, "gguf")
    assert advice in e.value.advice


def test_unsupported_architecture_lists_the_supported_ones(make_run, tmp_path):
    run = make_run("tiny-mistral-swa")
    for fmt in ("gguf", "gguf-lora", "ollama"):
        with pytest.raises(ExportError, match="does not support the mistral architecture") as e:
            export_run(run, fmt, tmp_path / fmt)
        assert all(arch in e.value.advice for arch in ("llama", "qwen2", "qwen3")), e.value.advice
        assert not (tmp_path / fmt).exists()


def test_existing_output_needs_force_and_force_only_replaces_exports(make_run, tmp_path):
    run = make_run("tiny-dense")
    out = tmp_path / "out"
    first = export_run(run, "adapter", out)
    (out / "stale.txt").write_text("from before")
    with pytest.raises(ExportError, match="already exists") as e:
        export_run(run, "adapter", out)
    assert "--force" in e.value.advice and (out / "stale.txt").exists()
    second = export_run(run, "adapter", out, force=True)
    assert second.passed and not (out / "stale.txt").exists()
    assert {p.name for p in second.files} == {p.name for p in first.files}

    mine = tmp_path / "my-folder"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    with pytest.raises(ExportError, match="not written by `hone export`"):
        export_run(run, "adapter", mine, force=True)
    assert (mine / "notes.txt").read_text() == "keep me"


def test_default_output_folder_is_inside_the_run(make_run):
    run = make_run("tiny-llama")
    result = export_run(run, "gguf-lora:f16")
    assert result.path == run / "exports" / "gguf-lora-f16" and result.path.is_dir()


def test_an_interrupted_export_leaves_nothing(make_run, tmp_path):
    run = make_run("tiny-dense")

    def progress(stage, done):
        if stage.startswith("writing"):
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        export_run(run, "gguf:f16", tmp_path / "out", progress=progress)
    assert list(tmp_path.iterdir()) == []


def test_progress_reports_stages_in_order_up_to_one(make_run, tmp_path):
    seen = []
    export_run(make_run("tiny-llama"), "gguf-lora", tmp_path / "out", progress=lambda s, f: seen.append((s, f)))
    fractions = [f for _, f in seen]
    assert fractions == sorted(fractions) and fractions[0] == 0.0 and seen[-1] == ("done", 1.0)
    assert next(s for s, _ in seen if s != "done") == "loading the base model"


def _damaged_copy(make_run, tmp_path, file: str, damage) -> object:
    import shutil

    run = shutil.copytree(make_run("tiny-dense"), tmp_path / "run")
    path = run / "adapter" / file
    path.write_bytes(damage(path.read_bytes()))
    return run


@pytest.mark.parametrize(
    "file, damage, words",
    [
        ("adapter_model.safetensors", lambda b: b[: len(b) // 2], "it is cut short: it should have"),
        ("adapter_model.safetensors", lambda b: b[:5], "it has 5 bytes, fewer than the 8"),
        ("adapter_model.safetensors", lambda b: b[:8] + b"{not json" + b[17:], "not the JSON table of tensors"),
        ("adapter_model.safetensors", lambda b: (10**12).to_bytes(8, "little") + b[8:], "announce a 1,000,000,000,000"),
        ("adapter_config.json", lambda b: b[: len(b) // 2], "it is not valid JSON"),
        ("adapter_config.json", lambda b: b"[1, 2]", "it holds a JSON list, not an object"),
        ("adapter_config.json", lambda b: b"\xff\xfe" + b, "byte 0 is not UTF-8 text"),
    ],
    ids=[
        "safetensors-cut",
        "safetensors-5-bytes",
        "safetensors-header",
        "safetensors-length",
        "json-cut",
        "json-list",
        "json-not-utf8",
    ],
)
def test_a_damaged_adapter_file_is_named_before_anything_loads(make_run, tmp_path, file, damage, words):
    run = _damaged_copy(make_run, tmp_path, file, damage)
    with pytest.raises(ExportError) as e:
        export_run(run, "adapter", tmp_path / "out")
    assert e.value.message.startswith(f"{run / 'adapter' / file} is damaged: ") and words in e.value.message
    assert f"hone train --resume {run}" in e.value.advice
    assert not (tmp_path / "out").exists()


def test_a_cut_adapter_says_how_long_it_should_be(make_run, tmp_path):
    whole = (make_run("tiny-dense") / "adapter" / "adapter_model.safetensors").stat().st_size
    run = _damaged_copy(make_run, tmp_path, "adapter_model.safetensors", lambda b: b[:-1])
    with pytest.raises(
        ExportError,
        match=f"it should have {whole:,} bytes .* but has {whole - 1:,} "
        r"\(1 missing\)",
    ):
        export_run(run, "gguf-lora", tmp_path / "out")


def test_whole_adapter_files_are_not_damaged(make_run):
    from hone.core.export.source import safetensors_damage

    assert safetensors_damage(make_run("tiny-dense") / "adapter" / "adapter_model.safetensors") is None


def test_a_full_disk_while_writing_is_an_export_error_and_leaves_nothing(tmp_path):
    import errno

    from hone.core.export.source import staged

    out = tmp_path / "exports" / "gguf"
    with pytest.raises(ExportError) as e, staged(out) as folder:
        (folder / "model.gguf").write_bytes(b"GGUF")
        raise OSError(errno.ENOSPC, "No space left on device", str(folder / "model.gguf"))
    assert e.value.message.startswith(f"the disk is full (or over quota) while writing the export to {out}")
    assert "another disk" in e.value.advice
    assert list((tmp_path / "exports").iterdir()) == []
