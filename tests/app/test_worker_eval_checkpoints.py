"""The Studio's in-process run (app.workers.core_trainer, as on Windows) scores the checkpoints of a run with
train.eval_checkpoints once it has ended, as `hone train` does: scores.json written, a Notice naming the best step."""

from __future__ import annotations

import json

from hone.core import events


def test_an_in_process_run_scores_its_checkpoints_after_its_end(tiny_model_dir, tmp_path):
    from hone.app.workers import core_trainer
    from hone.core.config import RunConfig
    from hone.core.control import RunControl
    from hone.core.demo.text_data import make_dataset

    train, eval_rows = make_dataset(n_train=24, n_eval=4, seed=3)
    files = {}
    for name, rows in (("train", train), ("eval", eval_rows)):
        files[name] = tmp_path / f"{name}.jsonl"
        files[name].write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    config = RunConfig().with_overrides(
        [
            f"model.name_or_path={json.dumps(str(tiny_model_dir('tiny-dense')))}",
            f"data.train=[{json.dumps(str(files['train']))}]",
            f"data.eval=[{json.dumps(str(files['eval']))}]",
            f"output.runs_dir={json.dumps(str(tmp_path / 'runs'))}",
            "output.name=r",
            "data.max_length=256",
            "train.batch_tokens=256",
            "train.max_steps=2",
            "train.lr=5e-2",
            "train.warmup_steps=1",
            "output.checkpoint_every=1",
            "train.eval_checkpoints=true",
        ]
    )
    got = list(core_trainer(config, RunControl()))
    finished = next(i for i, e in enumerate(got) if isinstance(e, events.RunFinished))
    (notice,) = got[finished + 1 :]
    stored = json.loads((tmp_path / "runs" / "r" / "scores.json").read_text())
    losses = {e["checkpoint"]: e["metrics"]["loss"] for e in stored["entries"]}
    assert sorted(losses, key=lambda s: -1 if s is None else s) == [None, 1, 2]
    best = min((s for s in losses if s is not None), key=losses.get)
    assert isinstance(notice, events.Notice) and notice.topic == "scores" and notice.level == "info"
    assert notice.message == f"scored 2 checkpoints and the base model; the best by held-out loss is step {best}"
