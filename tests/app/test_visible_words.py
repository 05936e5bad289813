"""What the Studio shows is written for users: no config keys (data.train_on), no backticked names, no `bundled:`
ids, export specs (gguf:q8_0) or environment variables in the text on the pages. Keys belong in tooltips only.

Every page is rendered as `hone studio` opens it (the demo model and data chosen, a finished run in the runs folder
opened on the Monitor), then every visible label, button, combo box entry, field and table cell is read."""

from __future__ import annotations

import dataclasses
import re
import time

import pytest
from PySide6.QtWidgets import (
    QAbstractButton,
    QComboBox,
    QGroupBox,
    QLabel,
    QLineEdit,
    QTableWidget,
    QTextEdit,
    QWidget,
)

from hone.core.config import DEMO_MODEL, DEMO_TRAIN_DATA, RunConfig
from hone.core.events import RunFinished, RunStarted, StepMetrics
from tests.app.conftest import settle_tasks


def config_keys() -> set[str]:
    """Every `section.field` of RunConfig, computed from the dataclasses (the keys a user must not see)."""
    keys = set()
    for section in dataclasses.fields(RunConfig):
        for f in dataclasses.fields(section.default_factory()):
            keys.add(f"{section.name}.{f.name}")
    return keys


KEY = re.compile(r"\b(" + "|".join(re.escape(k) for k in sorted(config_keys(), key=len, reverse=True)) + r")\b")
INTERNAL = (
    ("a config key", KEY),
    ("a backticked name", re.compile(r"`[^`]+`")),
    ("a bundled: id", re.compile(r"\bbundled:")),
    ("an export spec", re.compile(r"\b(gguf|ollama|merged):[A-Za-z0-9_]+")),
    ("an environment variable", re.compile(r"\bHF_[A-Z_]+")),
)


def internal_names(text: str) -> list[str]:
    """What in `text` is an internal name, each said as "<kind> (<match>)"."""
    return [f"{kind} ({m.group(0)})" for kind, pattern in INTERNAL for m in pattern.finditer(text)]


def test_the_patterns_catch_what_they_should_and_leave_plain_words():
    assert internal_names("set data.format to override") == ["a config key (data.format)"]
    assert internal_names("a folder saved by `datasets`") == ["a backticked name (`datasets`)"]
    assert internal_names("bundled:smollm2-135m-instruct") == ["a bundled: id (bundled:)"]
    assert internal_names("export gguf:f16 first") == ["an export spec (gguf:f16)"]
    assert internal_names("HF_HUB_OFFLINE is set") == ["an environment variable (HF_HUB_OFFLINE)"]
    # file names and plain words are not keys
    assert internal_names("train.jsonl, config.toml, train.log, e.g. SmolLM2-135M Instruct (bundled)") == []


def visible_texts(root: QWidget) -> list[tuple[str, str]]:
    """(widget class, text) of everything `root` shows: labels, buttons, group titles, combo entries, fields, cells."""
    found = []
    for widget in root.findChildren(QWidget):
        if not widget.isVisibleTo(root):
            continue
        kind = type(widget).__name__
        texts: list[str] = []
        if isinstance(widget, (QLabel, QAbstractButton)):
            texts.append(widget.text())
        elif isinstance(widget, QGroupBox):
            texts.append(widget.title())
        elif isinstance(widget, QComboBox):
            texts += [widget.itemText(i) for i in range(widget.count())]
        elif isinstance(widget, QTextEdit):  # rich-text reports (the Data page's), not logs (QPlainTextEdit)
            texts.append(widget.toPlainText())
        elif isinstance(widget, QLineEdit) and not isinstance(widget.parent(), QComboBox):
            texts += [widget.text(), widget.placeholderText()]
        if isinstance(widget, QComboBox) and widget.lineEdit() is not None:
            texts += [widget.currentText(), widget.lineEdit().placeholderText()]
        if isinstance(widget, QTableWidget):
            texts += [
                widget.item(r, c).text()
                for r in range(widget.rowCount())
                for c in range(widget.columnCount())
                if widget.item(r, c) is not None
            ]
        found += [(kind, t) for t in texts if t]
    return found


def _write_finished_run(folder) -> None:
    from hone.core.train.run_dir import RunWriter

    writer = RunWriter(folder, RunConfig())
    t0 = time.time()
    writer.write(
        RunStarted(
            run_dir=str(folder),
            model=DEMO_MODEL,
            device="cpu",
            dtype="float32",
            params_total=100,
            params_trainable=10,
            total_steps=2,
            tokens_per_epoch=64,
            time=t0,
            speed_paths={"embeddings": "on the GPU: only on a GPU (on the CPU the table is in host memory already)"},
        )
    )
    for step, loss in ((1, 2.0), (2, 1.5)):
        writer.write(
            StepMetrics(
                step=step,
                total_steps=2,
                epoch=0.0,
                loss=loss,
                lr=1e-4,
                grad_norm=1.0,
                tokens=32,
                trained_tokens=16,
                tokens_per_s=100.0,
                step_time=0.1,
                elapsed=0.1 * step,
            )
        )
    writer.write(RunFinished(step=2, run_dir=str(folder), adapter_dir="", final_loss=1.5, elapsed=1.0))
    writer.close()


@pytest.mark.parametrize(
    "pages",
    [("model", "data", "train", "monitor", "runs"), ("chat", "export")],
    ids=["model-data-train-monitor-runs", "chat-export"],
)
def test_no_page_shows_internal_names(qtbot, make_window, tmp_path, pages):
    _write_finished_run(tmp_path / "runs" / "demo-run")
    window = make_window()
    window.page("model").choose(DEMO_MODEL)
    window.page("data").set_files([DEMO_TRAIN_DATA], check=True)
    window.open_run(str(tmp_path / "runs" / "demo-run"))
    found = []
    for name in pages:
        window.show_page(name)
        page = window.page(name)
        if hasattr(page, "is_busy"):
            qtbot.waitUntil(lambda p=page: not p.is_busy(), timeout=120_000)
        settle_tasks(qtbot, 120_000)
        qtbot.wait(50)
        for kind, text in visible_texts(page):
            found += [f"{name} page, {kind} {text!r}: {what}" for what in internal_names(text)]
    assert not found, "internal names in view:\n" + "\n".join(found)


def test_the_data_pages_report_says_settings_in_the_forms_words(qtbot, window, tmp_path):
    import json

    rows = [
        {"messages": [{"role": "user", "content": "Say hi"}, {"role": "assistant", "content": "hi"}]},
        {"messages": [{"role": "user", "content": "no answer"}]},  # skipped: "... set data.train_on = "all""
    ]
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    window.state.update('model.name_or_path=""')
    page = window.page("data")
    with qtbot.waitSignal(page.checked, timeout=120_000) as blocker:
        page.set_files([str(data)], [], check=True)
    report = blocker.args[0].report
    said = " ".join(report.notes + report.skipped_examples)
    assert "data.train_on" in said and "data.format" in said, "the core's messages name the keys (for the CLI)"
    window.show_page("data")
    for tab in range(page.tabs.count()):
        page.tabs.setCurrentIndex(tab)
        found = [f"{kind} {text!r}: {what}" for kind, text in visible_texts(page) for what in internal_names(text)]
        assert not found, "\n".join(found)
    why = page.skipped_rows_table.item(0, 1).text()
    assert why.endswith("set “Train on” to “Every token”"), why
    assert "(set “Format” to override)" in page.report_text.toPlainText()


def test_the_model_box_shows_the_bundled_models_name_and_uses_its_id(qtbot, window):
    from PySide6.QtCore import Qt

    from hone.app.model_names import model_name

    assert model_name(DEMO_MODEL) == "SmolLM2-135M-Instruct (bundled)"
    assert model_name("Qwen/Qwen3-0.6B") == "Qwen/Qwen3-0.6B"
    page = window.page("model")
    box = page.name_box
    index = box.findData(DEMO_MODEL)
    assert box.itemText(index) == "SmolLM2-135M-Instruct (bundled)"
    assert box.itemData(index, Qt.ToolTipRole) == DEMO_MODEL, "the id, for people who write configs"
    window.state.update('model.name_or_path=""')
    box.setCurrentIndex(index)
    with qtbot.waitSignal(page.inspected, timeout=120_000) as blocker:
        page.use_button.click()
    assert isinstance(blocker.args[0], dict), blocker.args[0]
    assert window.state.config.model.name_or_path == DEMO_MODEL, "the name shown, the id chosen"


def test_the_hubs_offline_mode_is_said_in_words_with_the_variable_in_the_tooltip(qtbot, monkeypatch):
    from PySide6.QtCore import Qt

    from hone.app.widgets.hub_dialog import HubDialog

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    dialog = HubDialog()
    qtbot.addWidget(dialog)
    dialog.show()
    qtbot.keyClicks(dialog.query, "qwen")
    qtbot.keyClick(dialog.query, Qt.Key_Return)
    qtbot.waitUntil(lambda: not dialog.search_task.is_running(), timeout=10_000)
    text = dialog.status.text()
    assert text.startswith("Offline mode is on for the Hugging Face Hub"), text
    assert "turn offline mode off" in text.lower() and not internal_names(text), text
    assert "HF_HUB_OFFLINE" in dialog.status.toolTip()
