"""Chat page: Evaluate… answers the loaded run's held-out rows with the base and the fine-tune off the GUI thread,
then shows the scores and every row's answers, each marked against its reference."""

from __future__ import annotations

import json

from hone.core import events
from hone.core.config import RunConfig
from hone.core.demo.text_data import make_dataset
from hone.core.inference.prompts import read_prompts
from hone.core.train.trainer import Trainer
from tests.core.conftest import write_rows


def test_evaluate_scores_both_models_on_the_runs_eval_rows(qtbot, make_window, tiny_model_dir, settings, tmp_path):
    rows_train, rows_eval = make_dataset(n_train=24, n_eval=4, seed=3)
    train, eval_file = write_rows(tmp_path / "train.jsonl", rows_train), write_rows(tmp_path / "eval.jsonl", rows_eval)
    runs = settings.config().output.runs_dir
    config = RunConfig().with_overrides(
        [
            f"model.name_or_path={json.dumps(str(tiny_model_dir('tiny-dense')))}",
            f"data.train=[{json.dumps(str(train))}]",
            f"data.eval=[{json.dumps(str(eval_file))}]",
            f"output.runs_dir={json.dumps(runs)}",
            "output.name=scored",
            "data.max_length=256",
            "train.batch_tokens=256",
            "train.max_steps=2",
        ]
    )
    assert isinstance(list(Trainer(config, device="cpu").run())[-1], events.RunFinished)

    window = make_window()
    page = window.page("chat")
    window.show_page("chat")
    page.refresh_runs()
    page.select_run(f"{runs}/scored")
    page.load_selected()
    qtbot.waitUntil(lambda: page.loaded, timeout=120_000)
    assert page.evaluate_button.isEnabled()
    with qtbot.waitSignal(page.evaluation_finished, timeout=300_000):
        page.evaluate(rows=2)  # no file given: the run's own evaluation file
        assert page.generating and not page.evaluate_button.isEnabled() and page.stop_button.isEnabled()
    dialog = page.evaluation_dialog
    assert dialog is not None and dialog.isVisible()
    assert "Base: exact" in dialog.summary.text() and "fine-tuned: exact" in dialog.summary.text()
    table = dialog.table
    prompts, _ = read_prompts(eval_file)
    assert table.rowCount() == 2
    for r, prompt in enumerate(prompts[:2]):
        assert table.item(r, 0).text() == str(prompt.row)
        assert table.item(r, 2).text() == prompt.reference
        assert table.item(r, 4).text()[0] in "✓✗" and "F1 " in table.item(r, 4).text()
    assert "exact" in page.status.text() and page.send_button.isEnabled()
    dialog.close()


def test_evaluate_on_a_dpo_run_ranks_its_held_out_pairs(qtbot, make_window, tiny_model_dir, settings, tmp_path):
    """A preference run's Evaluate… ranks its held-out pairs with the base and the fine-tune (no file to pick):
    the accuracies agree with `score_pairs` on the same models and pairs."""
    from hone.core.api import ChatModels, held_out_pairs, score_pairs

    rows = [
        {"prompt": f"What is {a} plus {a + 1}?", "chosen": f" {2 * a + 1}, said kindly.", "rejected": f" {a}."}
        for a in range(16)
    ]
    data = write_rows(tmp_path / "pairs.jsonl", rows)
    runs = settings.config().output.runs_dir
    config = RunConfig().with_overrides(
        [
            f"model.name_or_path={json.dumps(str(tiny_model_dir('tiny-dense')))}",
            f"data.train=[{json.dumps(str(data))}]",
            "data.eval=[]",
            "data.eval_fraction=0.25",
            f"output.runs_dir={json.dumps(runs)}",
            "output.name=ranked",
            'train.method="dpo"',
            "data.max_length=128",
            "train.batch_tokens=512",
            "train.max_steps=4",
            "train.lr=5e-3",
        ]
    )
    assert isinstance(list(Trainer(config, device="cpu").run())[-1], events.RunFinished)

    window = make_window()
    page = window.page("chat")
    window.show_page("chat")
    page.refresh_runs()
    page.select_run(f"{runs}/ranked")
    page.load_selected()
    qtbot.waitUntil(lambda: page.loaded, timeout=120_000)
    with qtbot.waitSignal(page.evaluation_finished, timeout=300_000):
        page.evaluate(rows=0)
    dialog = page.evaluation_dialog
    assert dialog is not None and dialog.isVisible() and dialog.table.rowCount() == 3
    models = ChatModels.for_run(f"{runs}/ranked")
    want = score_pairs(models, held_out_pairs(RunConfig.load(f"{runs}/ranked/config.toml"), models.tokenizer))
    assert want.pairs == 4
    assert dialog.table.item(0, 0).text() == f"{want.accuracy(False):.1%}"
    assert dialog.table.item(0, 1).text() == f"{want.accuracy(True):.1%}"
    assert f"in {want.tuned_right} of 4 held-out pairs" in page.status.text()
    dialog.close()
