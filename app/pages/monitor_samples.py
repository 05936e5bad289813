"""The Monitor's Samples panel: how the answers to train.sample_prompts change from one evaluation to the next.

A run with sample prompts writes RUN_DIR/samples.jsonl at each evaluation (hone.core.train.samples_file). The panel
reads it off the GUI thread, bounded to the file's newest part (`read_samples`), when a run is opened or followed
(`set_run`) and again after each evaluation (`refresh`: the line is written before the evaluation's event). Pick a
prompt and the panel lists its answer at each evaluated step, oldest first, marking an answer the same as the one
before. Runs without sample prompts do not show it.
"""

from __future__ import annotations

import threading
from pathlib import Path

from PySide6.QtCore import Signal
from PySide6.QtWidgets import QComboBox, QHBoxLayout, QPlainTextEdit, QWidget

from hone.app.widgets.common import Card, label

# The text box's height: about twenty lines, the answers of several steps at once.
TEXT_HEIGHT = 300
# Characters of a prompt shown in the prompt list (the whole prompt heads the answers).
PROMPT_LABEL_CHARS = 90


class SamplesPanel(Card):
    """Sample answers of one run folder, by prompt and step."""

    _read = Signal(object, object)  # (run folder, [SampleStep]) from the reading thread

    def __init__(self, parent: QWidget | None = None):
        super().__init__("Sample answers", "The model's answers to the same prompts at each evaluation.", parent)
        row = QHBoxLayout()
        row.addWidget(label("Prompt"))
        self.prompt_box = QComboBox()
        self.prompt_box.setAccessibleName("Sample prompt")
        self.prompt_box.setToolTip("Which prompt's answers to show\n\ntrain.sample_prompts")
        self.prompt_box.currentIndexChanged.connect(self._show)
        row.addWidget(self.prompt_box, 1)
        self.body.addLayout(row)
        self.text = QPlainTextEdit()
        self.text.setReadOnly(True)
        self.text.setAccessibleName("Sample answers by step")
        self.text.setFixedHeight(TEXT_HEIGHT)
        self.body.addWidget(self.text)
        self.run_dir: Path | None = None
        self.steps: list = []  # [SampleStep], oldest first
        self._reading = False
        self._again = False
        self._read.connect(self._take)
        self.hide()

    def clear(self) -> None:
        """No run: nothing shown (a read still under way is dropped when it arrives)."""
        self.run_dir = None
        self.steps = []
        self.prompt_box.blockSignals(True)
        self.prompt_box.clear()
        self.prompt_box.blockSignals(False)
        self.text.clear()
        self.hide()

    def set_run(self, run_dir: str | Path) -> None:
        """Show the samples of `run_dir` (read now, in the background)."""
        run_dir = Path(run_dir)
        if run_dir != self.run_dir:
            self.clear()
            self.run_dir = run_dir
        self.refresh()

    def refresh(self) -> None:
        """Read the run's samples.jsonl again (one read at a time; a request during one reads once more after)."""
        if self.run_dir is None:
            return
        if self._reading:
            self._again = True
            return
        self._reading, self._again = True, False
        run_dir = self.run_dir
        threading.Thread(target=self._read_in_background, args=(run_dir,), daemon=True, name="samples").start()

    @property
    def busy(self) -> bool:
        return self._reading

    def _read_in_background(self, run_dir: Path) -> None:
        from hone.core.api import read_samples

        try:
            steps = read_samples(run_dir)
        except Exception:  # an unreadable file shows as no samples; the run's own log says what went wrong
            steps = []
        self._read.emit(run_dir, steps)

    def _take(self, run_dir: Path, steps: list) -> None:
        self._reading = False
        if run_dir == self.run_dir and steps != self.steps:
            self.steps = steps
            self._fill_prompts()
        if self._again:
            self.refresh()

    def _fill_prompts(self) -> None:
        prompts: list[str] = []
        for step in self.steps:
            for prompt, _ in step.samples:
                if prompt not in prompts:
                    prompts.append(prompt)
        chosen = self.prompt_box.currentData()
        self.prompt_box.blockSignals(True)
        self.prompt_box.clear()
        for prompt in prompts:
            one_line = " ".join(prompt.split())
            shown = one_line if len(one_line) <= PROMPT_LABEL_CHARS else one_line[: PROMPT_LABEL_CHARS - 1] + "…"
            self.prompt_box.addItem(shown, prompt)
        self.prompt_box.setCurrentIndex(max(0, prompts.index(chosen)) if chosen in prompts else 0)
        self.prompt_box.blockSignals(False)
        self.setVisible(bool(prompts))
        self._show()

    def answers_of(self, prompt: str) -> list[tuple[int, str]]:
        """(step, answer) of `prompt` at each evaluation that answered it, oldest first."""
        return [(step.step, answer) for step in self.steps for p, answer in step.samples if p == prompt]

    def _show(self) -> None:
        prompt = self.prompt_box.currentData()
        if prompt is None:
            self.text.clear()
            return
        lines = [f"Prompt: {prompt}", ""]
        previous = None
        for step, answer in self.answers_of(prompt):
            same = " (unchanged)" if answer == previous else ""
            lines += [f"Step {step}{same}", answer if answer.strip() else "(empty answer)", ""]
            previous = answer
        self.text.setPlainText("\n".join(lines).rstrip())
