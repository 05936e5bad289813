"""The Trainer on tiny vision-language model folders (loaded the way users' models are), with mixed data that also
holds a row whose image is missing and one whose image is corrupt: those two are reported and skipped, the rest
trains (text-only and image rows in the same batches), and the adapter is written."""

from __future__ import annotations

import json

import pytest
from vision_helpers import write_jsonl

from hone.core import events
from hone.core.config import RunConfig
from hone.core.data.rows import IMAGE_MISSING, IMAGE_UNREADABLE
from hone.core.train.trainer import Trainer


def broken_rows(folder):
    (folder / "corrupt.png").write_bytes(b"\x89PNG\r\n\x1a\n" + b"not really a png" * 8)
    ask = lambda image: {  # noqa: E731
        "messages": [
            {"role": "user", "content": [{"type": "image", "image": image}, {"type": "text", "text": "Color?"}]},
            {"role": "assistant", "content": "red"},
        ]
    }
    return [ask("missing.png"), ask("corrupt.png")]


@pytest.mark.parametrize("kind", ["qwen2_5_vl", "gemma3"])
def test_trainer_runs_mixed_data_and_skips_broken_images(kind, vision_model_dir, mixed_rows, tmp_path):
    folder, rows = mixed_rows
    data = write_jsonl(folder / f"train-{kind}.jsonl", rows + broken_rows(folder) + rows)
    config = RunConfig().with_overrides(
        [
            f"model.name_or_path={json.dumps(str(vision_model_dir(kind)))}",
            f"data.train=[{json.dumps(str(data))}]",
            f"output.runs_dir={json.dumps(str(tmp_path))}",
            "data.max_length=128",
            "data.image_max_side=64",
            "train.batch_tokens=160",
            "train.max_steps=3",
            "train.lr=1e-3",
            "train.warmup_steps=1",
            "lora.r=4",
            "lora.train_projector=true",
        ]
    )
    seen = list(Trainer(config).run())
    failed = [e for e in seen if isinstance(e, events.RunFailed)]
    assert not failed, failed[0].reason + "\n" + failed[0].details[-2000:]
    report = next(e for e in seen if isinstance(e, events.DatasetReport))
    assert report.rows_read == 10 and report.rows_kept == 8
    assert report.skipped == {IMAGE_MISSING: 1, IMAGE_UNREADABLE: 1}, report.skipped
    assert any("missing.png" in x for x in report.skipped_examples)
    assert any("corrupt.png" in x for x in report.skipped_examples)
    assert report.image_rows == 4
    started = next(e for e in seen if isinstance(e, events.RunStarted))
    assert started.is_vision
    steps = [e for e in seen if isinstance(e, events.StepMetrics)]
    assert len(steps) == 3 and all(s.loss == s.loss and s.loss > 0 for s in steps)
    notices = [e.message for e in seen if isinstance(e, events.Notice) and e.topic == "vision"]
    assert notices and ("packed" in notices[0]) == (kind == "qwen2_5_vl"), notices
    finished = next(e for e in seen if isinstance(e, events.RunFinished))
    from pathlib import Path

    from safetensors import safe_open

    with safe_open(str(Path(finished.adapter_dir) / "adapter_model.safetensors"), "pt") as f:
        keys = list(f.keys())
    projector = "merger" if kind == "qwen2_5_vl" else "multi_modal_projector"
    assert any("lora_A" in k for k in keys) and any(projector in k for k in keys)


def test_the_vision_benchmark_profiles_one_more_step_of_the_trainer(vision_model_dir, mixed_rows, tmp_path):
    """`hone bench vision-* --profile`: Hone's run trains one step more than it times, under torch.profiler (on
    the CPU each ATen op stands in for a kernel), and that step is not among the timed ones."""
    from hone.core.bench.vision import hone_steps

    folder, rows = mixed_rows
    data = write_jsonl(folder / "bench.jsonl", rows * 3)
    out = hone_steps(
        vision_model_dir("qwen2_5_vl"), data, tmp_path, steps=2, warmup=1, batch_tokens=256, lora_r=4, profile_top=5
    )
    assert len(out.times) == len(out.losses) == 2
    profile = out.profile
    assert profile["device"] == "cpu (ATen ops)" and profile["wall_ms"] > 0 and len(profile["kernels"]) == 5
    assert profile["phases"].get("forward", 0) > 0 and profile["phases"].get("backward", 0) > 0, profile["phases"]
    assert all(row["calls"] > 0 for row in profile["groups"]) and profile["kernel_launches"] > 100
