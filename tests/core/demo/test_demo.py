"""The embedded default: the shipped dataset is the generator's output, and `hone demo` runs end to end."""

from __future__ import annotations

import json

from hone.core.demo.text_data import make_dataset, write_demo_dataset
from hone.core.resources import resource_path


def test_shipped_demo_dataset_is_reproducible(tmp_path):
    write_demo_dataset(tmp_path)
    shipped = resource_path("datasets/json_extract")
    for name in ("train.jsonl", "eval.jsonl"):
        assert (tmp_path / name).read_bytes() == (shipped / name).read_bytes(), name


def test_held_out_people_never_appear_in_training():
    train, eval_rows = make_dataset()
    names = lambda rows: {json.loads(r["messages"][-1]["content"])["name"] for r in rows}  # noqa: E731
    assert not names(train) & names(eval_rows)
    assert len(train) == 360 and len(eval_rows) == 40


def test_demo_command_runs_end_to_end(tmp_path, capsys):
    """A short `hone demo` (1 step, 2 held-out rows) on the real bundled SmolLM2: it loads, scores, trains,
    writes the adapter and prints the before/after table."""
    from hone.core.cli import main

    code = main(["demo", "--runs-dir", str(tmp_path), "--steps", "1", "--eval-rows", "2"])
    err = capsys.readouterr().err
    assert code == 0, err[-3000:]
    assert "held-out exact match" in err and "+ Hone LoRA" in err
    for who in ("the base model", "the fine-tuned model"):  # each silent scoring says it starts and ends, once
        assert err.count(f"scoring {who} on 2 held-out rows ...\n") == 1, err[-3000:]
        assert err.count(f"scoring {who} on 2 held-out rows: 2 rows scored, done in ") == 1, err[-3000:]
    run_dir = next(tmp_path.iterdir())
    assert (run_dir / "adapter" / "adapter_model.safetensors").is_file()
    assert json.loads((run_dir / "run.json").read_text())["step"] == 1
