"""Chat page: the system prompt, top-p and repetition penalty reach the reply (written on the chat thread); a
template without a system role is said in words; Tab leaves the prompt; empty panes say what to do; and at the
window's minimum size nothing on the page is cut."""

from __future__ import annotations

import shutil

import pytest
from PySide6.QtCore import QPoint, QRect, Qt
from PySide6.QtWidgets import QAbstractScrollArea, QApplication, QLabel, QWidget

from hone.app.pages.chat import EMPTY_BASE, EMPTY_TUNED, NO_ADAPTER
from hone.core.api import BASE, TUNED, MachineFacts
from tests.core.inference.test_chat import NO_SYSTEM_TEMPLATE

QUESTION = "Name three colours."


@pytest.fixture
def base_only_window(make_window, settings):
    """A window whose Chat page offers a tiny random model as "Base model only" (no run needed)."""

    def make(model_dir):
        config = settings.config()
        config.model.name_or_path = str(model_dir)
        settings.set_config(config)
        window = make_window(machine=MachineFacts(gpu=""))
        window.show_page("chat")
        return window.page("chat")

    return make


def _load(qtbot, page) -> None:
    page.load_selected()
    qtbot.waitUntil(lambda: page.loaded, timeout=120_000)


def _ask(qtbot, page, question: str) -> dict:
    requests = []
    page._generate_requested.connect(requests.append)
    page.prompt.setPlainText(question)
    with qtbot.waitSignal(page.reply_finished, timeout=120_000):
        page.send()
    return requests[0]


def test_the_reply_follows_the_system_prompt_top_p_and_repetition_penalty(qtbot, base_only_window, tiny_model_dir):
    from hone.core.api import ChatModels, GenerationSettings

    folder = tiny_model_dir("tiny-dense")
    page = base_only_window(folder)
    _load(qtbot, page)
    assert page.system_prompt.isEnabled() and page.system_refusal == ""
    page.max_tokens.setValue(24)
    page.top_p.setValue(0.9)
    page.repetition_penalty.setValue(1.5)
    page.system_prompt.setText("You answer in French.")
    request = _ask(qtbot, page, QUESTION)
    want_settings = {
        "max_new_tokens": 24,
        "temperature": 0.0,
        "top_p": 0.9,
        "repetition_penalty": 1.5,
        "system_prompt": "You answer in French.",
    }
    assert request["settings"] == want_settings
    # the reference: the same model loaded here, answering with the same settings off the page
    models = ChatModels.load(str(folder))
    messages = [{"role": "user", "content": QUESTION}]
    want = "".join(models.stream(messages, GenerationSettings(**want_settings)))
    unpenalized = "".join(models.stream(messages, GenerationSettings(**{**want_settings, "repetition_penalty": 1.0})))
    assert want != unpenalized, "the penalty should matter for this check to mean anything"
    assert page.replies[BASE] == want
    assert page.transcripts[BASE].toPlainText().endswith(want.strip())
    assert page.status.property("role") != "error"


def test_a_template_without_a_system_role_says_so_and_still_chats(qtbot, base_only_window, tiny_model_dir, tmp_path):
    from transformers import AutoTokenizer

    folder = tmp_path / "no-system"
    shutil.copytree(tiny_model_dir("tiny-dense"), folder)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    tokenizer.chat_template = NO_SYSTEM_TEMPLATE
    tokenizer.save_pretrained(folder)
    page = base_only_window(folder)
    page.system_prompt.setText("Be brief.")
    _load(qtbot, page)
    text = page.status.text()
    assert "The system prompt is not used: this model's chat template takes no system message" in text, text
    assert not page.system_prompt.isEnabled() and "Not used" in page.system_prompt.toolTip()
    page.max_tokens.setValue(3)
    request = _ask(qtbot, page, QUESTION)
    assert request["settings"]["system_prompt"] == ""
    assert page.status.property("role") != "error", page.status.text()
    assert page.history[BASE][-1]["role"] == "assistant"


def test_tab_leaves_the_prompt_and_ctrl_enter_still_sends(qtbot, window):
    page = window.page("chat")
    window.show_page("chat")
    window.activateWindow()
    qtbot.waitUntil(lambda: QApplication.activeWindow() is window, timeout=5000)
    page.prompt.setFocus()
    qtbot.waitUntil(page.prompt.hasFocus, timeout=5000)
    qtbot.keyClicks(page.prompt, "What is 2+2?")
    qtbot.keyClick(page.prompt, Qt.Key_Tab)
    assert not page.prompt.hasFocus(), "Tab moves on instead of typing a tab"
    assert page.prompt.toPlainText() == "What is 2+2?"
    page.prompt.setFocus()
    qtbot.keyClick(page.prompt, Qt.Key_Return)  # Enter alone starts a new line
    assert page.prompt.toPlainText() == "What is 2+2?\n" and not page.generating
    page.loaded = True  # no weights: only that a reply is asked for
    qtbot.keyClick(page.prompt, Qt.Key_Return, Qt.ControlModifier)
    assert page.generating and page.prompt.toPlainText() == ""
    assert page.history[BASE] == [{"role": "user", "content": "What is 2+2?"}]


def test_empty_panes_say_what_to_do(qtbot, base_only_window, tiny_model_dir):
    page = base_only_window(tiny_model_dir("tiny-dense"))
    assert page.transcripts[BASE].empty_text() == EMPTY_BASE
    assert page.transcripts[TUNED].empty_text() == EMPTY_TUNED
    assert "Pick a run above" in EMPTY_BASE and "base model" in EMPTY_BASE
    assert page.transcripts[BASE].empty_note.isVisible()
    _load(qtbot, page)  # the base alone: the fine-tune's side says how to get one
    assert page.transcripts[TUNED].empty_text() == NO_ADAPTER
    assert page.transcripts[TUNED].empty_note.isVisible()
    page.transcripts[BASE].add_user("hello")
    assert page.transcripts[BASE].empty_text() == "" and not page.transcripts[BASE].empty_note.isVisible()


def _inside_scroll_area(widget: QWidget, top: QWidget) -> bool:
    parent = widget.parentWidget()
    while parent is not None and parent is not top:
        if isinstance(parent, QAbstractScrollArea):
            return True
        parent = parent.parentWidget()
    return False


def cut_widgets(page: QWidget) -> list[str]:
    """Every visible control of `page` whose box reaches outside its parent's, and every one-line label narrower than
    its text (what a scroll area shows inside itself is the scroll area's business, not the layout's)."""
    problems = []
    for widget in page.findChildren(QWidget):
        if not widget.isVisibleTo(page) or _inside_scroll_area(widget, page):
            continue
        parent = widget.parentWidget()
        name = f"{type(widget).__name__} {getattr(widget, 'text', lambda: '')()!r}"
        if not parent.rect().contains(widget.geometry()):
            problems.append(f"{name} at {widget.geometry().getRect()} outside {parent.rect().getRect()}")
        if isinstance(widget, QLabel) and not widget.wordWrap() and widget.width() < widget.sizeHint().width():
            problems.append(f"{name} is {widget.width()} px wide, its text needs {widget.sizeHint().width()}")
    return problems


def test_nothing_on_the_chat_page_is_cut_at_the_minimum_size(make_window):
    window = make_window(machine=MachineFacts(gpu=""))
    window.resize(980, 640)
    window.show_page("chat")
    page = window.page("chat")
    long_name = "qwen3-0.6b-customer-support-replies-lora-r16-lr2e-4-" + "x" * 40
    page.select_run(f"/runs/{long_name}")
    for _ in range(3):
        QApplication.processEvents()
    assert (window.width(), window.height()) == (980, 640)
    page_area = QRect(page.mapTo(window, QPoint(0, 0)), page.size())
    assert window.rect().contains(page_area)
    assert cut_widgets(page) == []
    for transcript in page.transcripts.values():
        assert transcript.height() >= transcript.minimumHeight() > 0
    box = page.run_box
    shown = box.shown_text()
    assert "…" in shown and box.toolTip() == long_name, "a long run name is shortened, whole in its tooltip"
    assert box.fontMetrics().horizontalAdvance(shown) <= box.width()
    assert shown.startswith("qwen3") and shown.endswith("x"), "its start and end stay readable"
