"""Data page with preference data: a DPO run's pairs and a KTO run's labelled answers are checked as training reads
them, the preview lists them, and the inspector shows the prompt once and each answer beside it with its trained
tokens highlighted and its token counts, the same tokens training uses."""

from __future__ import annotations

import json

from hone.core.config import DataConfig

PAIRS = [
    {"prompt": "The sky is", "chosen": " blue on a clear day.", "rejected": " green."},
    {
        "prompt": [{"role": "user", "content": "What is 2 + 2?"}],
        "chosen": [{"role": "assistant", "content": "2 + 2 is 4."}],
        "rejected": [{"role": "assistant", "content": "Five, or so."}],
    },
    {"prompt": "Same", "chosen": " answer", "rejected": " answer"},  # identical answers: skipped
]
KTO = [
    {"prompt": "The sky is", "completion": " blue.", "label": True},
    {"prompt": "Grass is", "completion": " purple.", "label": False},
    {"prompt": "2 + 2 =", "chosen": " 4", "rejected": " 5"},  # a pair: its answers desirable and undesirable
    {"prompt": "No label", "completion": " here"},  # skipped: no label
]


def _write(path, rows) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return str(path)


def _check(qtbot, window, model_dir, method: str, path: str):
    window.state.update(f'model.name_or_path="{model_dir.as_posix()}"', f'train.method="{method}"')
    page = window.page("data")
    with qtbot.waitSignal(page.checked, timeout=120_000) as blocker:
        page.set_files([path], [], check=True)
    return page, blocker.args[0]


def _trained_text(browser) -> str:
    """The text a browser shows highlighted as trained (bold runs), line breaks left out."""
    from PySide6.QtGui import QFont

    out = []
    block = browser.document().begin()
    while block.isValid():
        it = block.begin()
        while not it.atEnd():
            fragment = it.fragment()
            if fragment.charFormat().fontWeight() >= QFont.DemiBold:
                out.append(fragment.text())
            it += 1
        block = block.next()
    return "".join(out).replace("\u2028", "")


def _trained(answer) -> str:
    return "".join(p.text for p in answer.answer if p.trained).replace("\n", "")


def test_the_inspector_shows_a_pair_side_by_side_with_the_tokens_training_uses(
    qtbot, window, tiny_model_dir, smollm2_tokenizer, tmp_path
):
    from hone.core.data.preference import load_preference_data

    path = _write(tmp_path / "pairs.jsonl", PAIRS)
    page, result = _check(qtbot, window, tiny_model_dir("tiny-dense"), "dpo", path)
    assert (result.report.rows_read, result.report.rows_kept) == (3, 2)
    assert page.kept_tile.value() == "2" and page.skipped_tile.value() == "1"
    assert result.lengths.size == 4, "the histogram counts each answer's sequence"
    listed = [page.skipped_rows_table.item(r, 0).text() for r in range(page.skipped_rows_table.rowCount())]
    assert listed == ["pairs.jsonl:3"]

    assert page.preview_table.rowCount() == 2
    assert [page.preview_table.item(r, 0).text() for r in range(2)] == ["1", "2"]
    assert "The sky is" in page.preview_table.item(0, 1).text()
    response = page.preview_table.item(0, 2).text()
    assert "blue on a clear day." in response and "green." in response

    training = load_preference_data(DataConfig(train=[path]), smollm2_tokenizer).train  # the same tokenizer
    inspector = page.pair_inspector
    for row in (0, 1):
        page.preview_table.selectRow(row)
        assert not inspector.isHidden() and page.inspector.isHidden()  # (hidden: explicitly, whatever the tab)
        view = result.preview[row]
        for answer, sequence in zip(view.answers, training[row].sequences, strict=True):
            assert answer.token_ids == list(sequence.input_ids)
            assert answer.trained == [label != -100 for label in sequence.labels]
        chosen, rejected = inspector.columns[0], inspector.columns[1]
        assert chosen.title.text().startswith("Chosen") and rejected.title.text().startswith("Rejected")
        for column, answer in ((chosen, view.answers[0]), (rejected, view.answers[1])):
            counts = column.counts.text()
            assert f"{answer.num_tokens:,} tokens" in counts and f"{answer.num_trained:,} trained" in counts
            assert f"{answer.prompt_tokens:,} prompt" in counts
            assert _trained_text(column.text) == _trained(answer)
        assert str(len(training[row].input_ids)) in page.inspector_title.text().replace(",", "")
    # the prompt once, above both answers; each answer's own text beside it
    shown_prompt = inspector.prompt.toPlainText()
    assert "What is 2 + 2?" in shown_prompt
    assert "What is 2 + 2?" not in inspector.columns[0].text.toPlainText()
    assert "2 + 2 is 4." in _trained_text(inspector.columns[0].text)  # highlighted: what DPO scores
    assert "Five, or so." in _trained_text(inspector.columns[1].text)

    # a skipped pair opens as the file holds it, in the plain inspector
    with qtbot.waitSignal(page.inspected, timeout=30_000):
        page.skipped_rows_table.selectRow(0)
    assert not page.inspector.isHidden() and inspector.isHidden()
    assert json.loads(page.inspector.toPlainText()) == PAIRS[2]
    assert "nothing to prefer" in page.inspector_title.text()


def test_the_inspector_shows_a_kto_answer_with_its_label(qtbot, window, tiny_model_dir, smollm2_tokenizer, tmp_path):
    from hone.core.data.unpaired import load_unpaired_data

    path = _write(tmp_path / "kto.jsonl", KTO)
    page, result = _check(qtbot, window, tiny_model_dir("tiny-dense"), "kto", path)
    assert (result.report.rows_read, result.report.rows_kept) == (4, 4)  # 4 answers kept from 3 rows
    assert result.lengths.size == 4
    assert [page.preview_table.item(r, 0).text() for r in range(page.preview_table.rowCount())] == ["1", "2", "3"]
    training = load_unpaired_data(DataConfig(train=[path]), smollm2_tokenizer).train
    inspector = page.pair_inspector

    page.preview_table.selectRow(1)
    (answer,) = result.preview[1].answers
    assert answer.side == "undesirable" and answer.token_ids == list(training[1].input_ids)
    assert inspector.columns[0].title.text().startswith("Undesirable") and inspector.columns[1].isHidden()
    assert _trained_text(inspector.columns[0].text) == _trained(answer)
    assert "purple." in _trained_text(inspector.columns[0].text) and "Grass is" in inspector.prompt.toPlainText()

    page.preview_table.selectRow(2)  # a paired row: both answers, labelled
    titles = [c.title.text() for c in inspector.columns if not c.isHidden()]
    assert [t.split()[0] for t in titles] == ["Desirable", "Undesirable"]
    assert [a.token_ids for a in result.preview[2].answers] == [list(training[k].input_ids) for k in (2, 3)]
    assert inspector.columns[1].counts.text().startswith(f"{len(training[3].input_ids):,} tokens")


def test_choosing_a_preference_method_checks_the_data_again_as_pairs(qtbot, window, tiny_model_dir, tmp_path):
    path = _write(tmp_path / "pairs.jsonl", PAIRS)
    page, result = _check(qtbot, window, tiny_model_dir("tiny-dense"), "sft", path)
    assert result.report.rows_kept == 0  # pairs are no supervised rows
    with qtbot.waitSignal(page.checked, timeout=120_000) as blocker:
        window.state.update('train.method="orpo"')
    result = blocker.args[0]
    assert result.method == "orpo" and result.report.rows_kept == 2 and page.preview_table.rowCount() == 2
    assert [a.side for a in result.preview[0].answers] == ["chosen", "rejected"]
