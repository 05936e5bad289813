"""Chat page: replies are plain text (not the heading's bold), a "Generating…" note while a reply streams, and
no loading models while a run trains."""

from __future__ import annotations

import threading

from PySide6.QtGui import QFont

from hone.core.events import RunFinished, RunStarted


def _weights(transcript, text: str) -> set[int]:
    """Font weights of every fragment of the transcript that holds part of `text`."""
    weights = set()
    block = transcript.document().begin()
    while block.isValid():
        it = block.begin()
        while not it.atEnd():
            fragment = it.fragment()
            if fragment.text().strip() and fragment.text() in text:
                weights.add(fragment.charFormat().fontWeight())
            it += 1
        block = block.next()
    return weights


def test_a_streamed_reply_is_plain_and_says_it_is_generating(window):
    page = window.page("chat")
    window.show_page("chat")
    page.loaded = True  # no weights: the reply's pieces are fed as the chat thread would send them
    page.prompt.setPlainText("What is 2+2?")
    page.send()
    assert page.generating and page.generating_label.isVisibleTo(page)
    for piece in ("The answer ", "is 4."):
        page._piece(("base", piece))
    page._reply_done()
    assert not page.generating_label.isVisibleTo(page)
    transcript = page.transcripts["base"]
    assert _weights(transcript, "The answer is 4.") == {QFont.Normal}
    assert _weights(transcript, "What is 2+2?") == {QFont.Normal}
    assert QFont.Bold in _weights(transcript, "Assistant"), "the heading itself stays bold"


def test_load_models_is_off_while_a_run_trains(qtbot, make_window):
    release = threading.Event()

    def waiting(config, control, resume=None):
        yield RunStarted(
            run_dir="/tmp/x",
            model="m",
            device="cpu",
            dtype="float32",
            params_total=1,
            params_trainable=1,
            total_steps=1,
            tokens_per_epoch=1,
        )
        release.wait(10)
        yield RunFinished(step=0, run_dir="/tmp/x", adapter_dir="", final_loss=1.0, elapsed=0.1, stopped=True)

    window = make_window(trainer=waiting)
    page = window.page("chat")
    assert page.load_button.isEnabled()
    window.state.session.start(window.state.config)
    qtbot.waitUntil(lambda: window.state.session.is_running, timeout=10_000)
    assert not page.load_button.isEnabled() and "training" in page.load_button.toolTip()
    release.set()
    qtbot.waitUntil(lambda: not window.state.session.is_running, timeout=10_000)
    assert page.load_button.isEnabled()
