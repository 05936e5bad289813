"""Exports that cannot be done say why and what to do; existing output is never overwritten by accident; an
interrupted export leaves nothing behind."""

from __future__ import annotations

import json

import pytest

from hone.core.config import ModelConfig, RunConfig
from hone.core.export import ExportError, export_run


def test_missing_folder_and_non_run_folder(tmp_path):
    with pytest.raises(ExportError, match="does not exist"):
        export_run(tmp_path / "nope", "adapter")
    with pytest.raises(ExportError, match="not a run folder"):
        export_run(tmp_path, "adapter")


@pytest.mark.parametrize("status, advice", [("running", "still training"), ("failed", "out of memory"),
                                            ("stopped", "hone train --resume")])
def test_run_without_adapter_says_so(tmp_path, status, advice):
    run = tmp_path / "run"
    run.mkdir()
    RunConfig(model=ModelConfig(name_or_path="some/model")).save(run / "config.toml")
    (run / "run.json").write_text(json.dumps({"run_dir": str(run), "name": "run", "model": "some/model",
                                              "status": status, "reason": "out of memory"}))
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
