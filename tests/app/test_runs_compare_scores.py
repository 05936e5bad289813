"""The Runs page's comparison names each run's best scored checkpoint (from its scores.json): two real tiny CPU runs
with a checkpoint at each step, one scored by `hone eval --checkpoints all`, the other never scored."""

from __future__ import annotations

import json

from hone.core import events


def _train(runs_dir, model_dir, files, name: str) -> None:
    from hone.core.config import RunConfig
    from hone.core.train.trainer import Trainer

    config = RunConfig().with_overrides(
        [
            f"model.name_or_path={json.dumps(str(model_dir))}",
            f"data.train=[{json.dumps(str(files['train']))}]",
            f"data.eval=[{json.dumps(str(files['eval']))}]",
            f"output.runs_dir={json.dumps(str(runs_dir))}",
            f"output.name={name}",
            "data.max_length=256",
            "train.batch_tokens=256",
            "train.max_steps=2",
            "train.lr=5e-2",
            "train.warmup_steps=1",
            "output.checkpoint_every=1",
        ]
    )
    got = list(Trainer(config, device="cpu").run())
    assert isinstance(got[-1], events.RunFinished), got[-1]


def test_the_numbers_table_shows_the_best_scored_checkpoint(qtbot, make_window, tiny_model_dir, tmp_path):
    from hone.core.cli import main
    from hone.core.demo.text_data import make_dataset

    train, eval_rows = make_dataset(n_train=24, n_eval=4, seed=3)
    files = {}
    for name, rows in (("train", train), ("eval", eval_rows)):
        files[name] = tmp_path / f"{name}.jsonl"
        files[name].write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    runs_dir = tmp_path / "runs"  # the settings fixture's output.runs_dir: the Runs page lists these
    for name in ("scored", "unscored"):
        _train(runs_dir, tiny_model_dir("tiny-dense"), files, name)
    assert main(["eval", str(runs_dir / "scored"), "--checkpoints", "all", "--rows", "0"]) == 0
    stored = json.loads((runs_dir / "scored" / "scores.json").read_text())
    losses = {e["checkpoint"]: e["metrics"]["loss"] for e in stored["entries"] if e["checkpoint"] is not None}
    best = min(losses, key=losses.get)

    window = make_window()
    window.show_page("runs")
    page = window.page("runs")
    page.refresh()
    rows = {page.table.item(row, 0).text(): row for row in range(page.table.rowCount())}
    page.select([rows["scored"], rows["unscored"]])
    page.compare_button.click()
    view = page.comparison
    qtbot.waitUntil(lambda: view.comparison is not None and not view.reading, timeout=20_000)
    shown = {row["run"]: row["best checkpoint"] for row in view.metrics_rows()}
    assert shown == {"scored": f"step {best} · loss {losses[best]:.4f}", "unscored": "—"}
