"""The embedded default: the shipped dataset is the generator's output, and `hone demo` runs end to end."""

from __future__ import annotations

import json

from hone.core.config import DEMO_EVAL_DATA
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


def test_demo_command_runs_end_to_end(tmp_path, capsys, monkeypatch):
    """A short `hone demo` (1 step, 2 held-out rows) on the real bundled SmolLM2: it loads, scores, trains,
    writes the adapter and prints the before/after table.

    The shipped config's held-out file is cut to the 2 rows scored: the run's end-of-training eval loss reads the
    same file, and over all 40 rows it cost more CPU time than the training step and both scorings together."""
    from hone.core.cli import main
    from hone.core.demo import text

    held_out = tmp_path / "eval.jsonl"
    held_out.write_text("".join(json.dumps(row) + "\n" for row in text.load_rows(DEMO_EVAL_DATA)[:2]), encoding="utf-8")
    from hone.core.api import demo as api_demo

    shipped = text.demo_config

    def cut(*args, **kwargs):
        return shipped(*args, **kwargs).with_overrides([f"data.eval=[{json.dumps(str(held_out))}]"])

    # both names: hone.core.api.demo took its own reference to demo_config when first imported
    monkeypatch.setattr(text, "demo_config", cut)
    monkeypatch.setattr(api_demo, "demo_config", cut)
    runs = tmp_path / "runs"
    code = main(["demo", "--runs-dir", str(runs), "--steps", "1", "--eval-rows", "2"])
    err = capsys.readouterr().err
    assert code == 0, err[-3000:]
    assert "held-out exact match" in err and "+ Hone LoRA" in err
    for who in ("the base model", "the fine-tuned model"):  # each silent scoring says it starts and ends, once
        assert err.count(f"scoring {who} on 2 held-out rows ...\n") == 1, err[-3000:]
        assert err.count(f"scoring {who} on 2 held-out rows: 2 rows scored, done in ") == 1, err[-3000:]
    run_dir = next(runs.iterdir())
    assert (run_dir / "adapter" / "adapter_model.safetensors").is_file()
    assert json.loads((run_dir / "run.json").read_text())["step"] == 1
