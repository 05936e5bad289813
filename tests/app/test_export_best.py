"""Pick and ship from the Studio: the Export page offers the final adapter, the best checkpoint by each stored metric
and every checkpoint; exporting the best one writes that checkpoint's adapter with its scores in the model card, and
the Runs page's "Export best…" opens the Export page on it. A tiny run trained 3 CPU steps with a checkpoint each,
scored by `hone eval --checkpoints all`."""

from __future__ import annotations

import json
import shutil

import pytest

STEPS = 3


@pytest.fixture(scope="module")
def scored_run(tiny_model_dir, tmp_path_factory):
    from hone.core import events
    from hone.core.cli import main
    from hone.core.config import RunConfig
    from hone.core.demo.text_data import make_dataset
    from hone.core.train.trainer import Trainer
    from tests.core.conftest import write_rows

    runs, data = tmp_path_factory.mktemp("runs"), tmp_path_factory.mktemp("data")
    rows, held_out = make_dataset(n_train=24, n_eval=4, seed=3)
    train, eval_file = write_rows(data / "train.jsonl", rows), write_rows(data / "eval.jsonl", held_out)
    config = RunConfig().with_overrides(
        [
            f"model.name_or_path={json.dumps(str(tiny_model_dir('tiny-dense')))}",
            f"data.train=[{json.dumps(str(train))}]",
            f"data.eval=[{json.dumps(str(eval_file))}]",
            f"output.runs_dir={json.dumps(str(runs))}",
            "output.name=scored",
            "output.checkpoint_every=1",
            f"output.keep_checkpoints={STEPS}",
            "data.max_length=256",
            "train.batch_tokens=256",
            f"train.max_steps={STEPS}",
            "train.lr=2e-2",
            "train.warmup_steps=1",
        ]
    )
    seen = list(Trainer(config, device="cpu").run())
    assert isinstance(seen[-1], events.RunFinished), seen[-1]
    run_dir = runs / "scored"
    assert main(["eval", str(run_dir), "--checkpoints", "all", "--rows", "0"]) == 0
    return run_dir


def test_the_choices_name_the_best_by_each_metric_and_every_step(scored_run, tmp_path):
    from hone.core.api import best_stored, weights_choices

    choices, note = weights_choices(scored_run)
    assert choices[0].label == "Final adapter" and choices[0].checkpoint is None
    best = {c.by: c for c in choices if c.by}
    assert best["loss"].checkpoint == best_stored(scored_run, "loss").checkpoint
    assert best["f1"].checkpoint == best_stored(scored_run, "f1").checkpoint
    assert best["loss"].scores["metrics"]["loss"] == pytest.approx(best_stored(scored_run).metrics["loss"])
    steps = [c for c in choices if c.checkpoint is not None and not c.by]
    assert [c.checkpoint for c in steps] == [1, 2, 3]
    assert all("held-out loss" in c.label and c.scores for c in steps)
    assert "held-out rows" in note

    unscored = tmp_path / "unscored"
    shutil.copytree(scored_run, unscored)
    (unscored / "scores.json").unlink()
    choices, note = weights_choices(unscored)
    assert [c.checkpoint for c in choices] == [None, 1, 2, 3] and not any(c.scores for c in choices)
    assert "not scored yet" in note


def test_exporting_the_best_checkpoint_from_the_export_page(qtbot, window, scored_run):
    from hone.core.api import best_stored

    page = window.page("export")
    page.set_run(str(scored_run))
    labels = [page.weights_box.itemText(i) for i in range(page.weights_box.count())]
    assert labels[0] == "Final adapter" and any(label.startswith("Best by held-out loss: step") for label in labels)
    want = best_stored(scored_run).checkpoint
    page.select_weights(best_by="loss")
    page.format_buttons["adapter"].click()
    assert page.out_edit.text().endswith(f"adapter-step-{want}"), "the checkpoint's own folder, as the CLI's"
    page.force_box.setChecked(True)
    with qtbot.waitSignal(page.exported, timeout=120_000) as done:
        page.export_button.click()
    result = done.args[0]
    assert not hasattr(result, "message"), result.message
    assert result.passed, result.failures
    card = (result.path / "README.md").read_text()
    assert f"step {want}" in card and "loss" in card
    record = json.loads((result.path / "export.json").read_text())
    assert json.dumps(record).count(str(want)) >= 1

    page.weights_box.setCurrentIndex(0)  # the final adapter again: its own folder
    assert page.out_edit.text().endswith("exports/adapter")


def test_the_runs_page_opens_the_export_page_on_the_best_checkpoint(qtbot, window, scored_run):
    from hone.core.api import best_stored

    runs = window.page("runs")
    window.state.update(f"output.runs_dir={json.dumps(str(scored_run.parent))}")
    runs.refresh()
    qtbot.waitUntil(lambda: runs.table.rowCount() >= 1, timeout=10_000)
    runs.table.selectRow(0)
    assert runs.best_button.isEnabled()
    runs.best_button.click()
    assert window.current_page() == "export"
    page = window.page("export")
    assert page.run_dir() == str(scored_run)
    chosen = page.weights_box.currentData()
    assert chosen.by == "loss" and chosen.checkpoint == best_stored(scored_run).checkpoint
