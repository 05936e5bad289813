"""The Monitor's charts of a training method's own numbers, shown only for runs of that method.

Preference runs (train.method dpo, simpo, orpo, kto) chart the reward margin, the reward accuracy and the chosen and
rejected answers' log-probabilities; GRPO runs the reward's mean with its spread (mean ± one standard deviation), each
named reward's mean, the sampled answers' length, the KL to the base model and the share of clipped tokens. A run's
method comes from its RunStarted config (the charts show, empty, from its start) or, for a run whose config does not
say, from its step lines (a line carries these fields only in runs of the method: hone.core.events.StepMetrics).
Supervised runs show none of them.
"""

from __future__ import annotations

from collections import deque
from pathlib import Path
from typing import ClassVar

import numpy as np
from PySide6.QtWidgets import QGridLayout, QPlainTextEdit, QVBoxLayout, QWidget

from hone.app.widgets.charts import LiveChart
from hone.app.widgets.common import label
from hone.core.events import EventError, StepMetrics, from_line

PREFERENCE = ("dpo", "simpo", "orpo", "kto")
# Palette colours of the per-reward lines, in the order the rewards first appear.
REWARD_COLOURS = ("speed", "eval", "lr", "util", "mem_alloc", "mem_device", "loss", "smooth")
# The charts' plot height: that of the Monitor's other charts (monitor.CHART_HEIGHT).
CHART_HEIGHT = 210
SAMPLE_STEPS = 50  # steps whose sampled answers the panel keeps, newest first
SAMPLES_TAIL_BYTES = 1 << 20  # how much of a replayed run's metrics.jsonl, from its end, is searched for them


def _line(title: str, key: str, name: str, colour: str, unit: str = "", y_format: str = "{:.4f}") -> LiveChart:
    chart = LiveChart(title, unit=unit, y_format=y_format, steps=True)
    chart.add_line(key, name, colour)
    chart.plot.setFixedHeight(CHART_HEIGHT)
    return chart


class MethodCharts(QWidget):
    """Two groups of charts, `preference` and `grpo`, at most one shown: `method` says which ("" for none)."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.margin_chart = _line("Reward margin", "margin", "chosen − rejected reward", "loss")
        self.accuracy_chart = _line("Reward accuracy", "accuracy", "pairs ranked right", "eval", "%", "{:.1f}")
        self.logps_chart = LiveChart("Log-probabilities", y_format="{:.2f}", steps=True)
        self.logps_chart.add_line("chosen", "chosen", "success", width=2.0)
        self.logps_chart.add_line("rejected", "rejected", "danger", width=2.0)
        self.logps_chart.plot.setFixedHeight(CHART_HEIGHT)
        self.reward_chart = LiveChart("Reward", y_format="{:.3f}", steps=True)
        self.reward_chart.add_line("mean", "mean", "loss", width=2.2)
        self.reward_chart.add_line("high", "mean + std", "smooth", width=1.2, dashed=True)
        self.reward_chart.add_line("low", "mean − std", "smooth", width=1.2, dashed=True)
        self.reward_chart.plot.setFixedHeight(CHART_HEIGHT)
        self.rewards_chart = LiveChart("Rewards", y_format="{:.3f}", steps=True)  # a line per named reward
        self.rewards_chart.plot.setFixedHeight(CHART_HEIGHT)
        self.length_chart = _line("Completion length", "length", "tokens per answer", "speed", "tokens", "{:.0f}")
        self.kl_chart = _line("KL to the base model", "kl", "KL", "lr", y_format="{:.4g}")
        self.clip_chart = _line("Clipped tokens", "clip", "share clipped", "warning", "%", "{:.1f}")
        self.samples_panel = QWidget()  # GRPO: the best- and worst-rewarded answers of the latest steps
        column = QVBoxLayout(self.samples_panel)
        column.setContentsMargins(0, 0, 0, 0)
        column.addWidget(label("Sampled answers: the best and the worst of each step", "muted"))
        self.samples_text = QPlainTextEdit()
        self.samples_text.setReadOnly(True)
        self.samples_text.setAccessibleName("Sampled answers")
        self.samples_text.setFixedHeight(CHART_HEIGHT)
        self.samples_text.setPlaceholderText("Answers appear here after each step.")
        column.addWidget(self.samples_text)
        self._samples: deque[tuple[int, list[str]]] = deque(maxlen=SAMPLE_STEPS)
        self.preference = [self.margin_chart, self.accuracy_chart, self.logps_chart]
        self.grpo = [self.reward_chart, self.rewards_chart, self.length_chart, self.kl_chart, self.clip_chart]
        self.charts = self.preference + self.grpo
        grid = QGridLayout(self)
        grid.setContentsMargins(0, 0, 0, 0)
        grid.setSpacing(12)
        for column, chart in enumerate(self.preference):
            grid.addWidget(chart, 0, column)
        grid.addWidget(self.reward_chart, 1, 0)
        grid.addWidget(self.rewards_chart, 1, 1)
        grid.addWidget(self.length_chart, 1, 2)
        grid.addWidget(self.kl_chart, 2, 0)
        grid.addWidget(self.clip_chart, 2, 1)
        grid.addWidget(self.samples_panel, 2, 2)
        for column in range(3):
            grid.setColumnStretch(column, 1)
        self.method = ""
        self.reset()

    def reset(self) -> None:
        """A new run: no points (the page clears them), no named rewards, nothing shown."""
        for key in list(self.rewards_chart.series):
            self.rewards_chart.remove_line(key)
        for chart in self.charts:
            chart.clear()
        self._samples.clear()
        self.samples_text.clear()
        self._show("")

    def set_method(self, config: dict) -> None:
        """The run's method from its RunStarted config (train.method), where it says one."""
        train = config.get("train") if isinstance(config, dict) else None
        method = train.get("method") if isinstance(train, dict) else None
        if method in PREFERENCE:
            self._show("preference")
        elif method == "grpo":
            self._show("grpo")
        elif isinstance(method, str):
            self._show("")

    def add_step(self, event: StepMetrics) -> None:
        """One step's numbers (live)."""
        if not self.method and (event.reward_margin is not None or event.reward_accuracy is not None):
            self._show("preference")
        if not self.method and event.reward_mean is not None:
            self._show("grpo")
        x = float(event.step)
        for chart, key, value, scale in self._scalars(lambda name: getattr(event, name)):
            if value is not None:
                chart.append(key, x, value * scale)
        if event.reward_mean is not None and event.reward_std is not None:
            self.reward_chart.append("high", x, event.reward_mean + event.reward_std)
            self.reward_chart.append("low", x, event.reward_mean - event.reward_std)
        for name, value in event.rewards.items():
            self._reward_line(name)
            self.rewards_chart.append(name, x, value)
        if event.samples:
            self._samples.append((event.step, list(event.samples)))
            self._show_samples()

    def load_samples(self, run_dir: str | Path) -> None:
        """The sampled answers of a run read from its folder (the charts' columns do not carry text): those of the
        step lines in the last SAMPLES_TAIL_BYTES of its metrics.jsonl; lines that hold no event are passed over."""
        from hone.core.api import METRICS_FILE

        try:
            with open(Path(run_dir) / METRICS_FILE, "rb") as f:
                f.seek(0, 2)
                f.seek(max(0, f.tell() - SAMPLES_TAIL_BYTES))
                tail = f.read(SAMPLES_TAIL_BYTES).split(b"\n")[1:]
        except OSError:
            return
        for line in tail:
            if b'"samples"' not in line:
                continue
            try:
                event = from_line(line.decode("utf-8", errors="replace"))
            except (EventError, ValueError):
                continue
            if isinstance(event, StepMetrics) and event.samples:
                self._samples.append((event.step, list(event.samples)))
        self._show_samples()

    def _show_samples(self) -> None:
        text = "\n\n".join(f"step {step}\n" + "\n".join(lines) for step, lines in reversed(self._samples))
        self.samples_text.setPlainText(text)

    def add_steps(self, steps: np.ndarray, method: dict[str, np.ndarray], rewards: dict[str, np.ndarray]) -> None:
        """A run of steps read from the run folder: `steps` (n,) float64, `method` and `rewards` (n,) float64 columns
        by field and by reward name, NaN where a line has none (hone.core.api.StepBlock)."""
        if not method or not len(steps):
            return
        present = {name: ~np.isnan(values) for name, values in method.items()}
        if not self.method and (present["reward_margin"].any() or present["reward_accuracy"].any()):
            self._show("preference")
        if not self.method and present["reward_mean"].any():
            self._show("grpo")
        for chart, key, values, scale in self._scalars(method.__getitem__):
            have = present[self._field[key]]
            chart.extend(key, steps[have], values[have] * scale)
        spread = present["reward_mean"] & present["reward_std"]
        mean, std = method["reward_mean"][spread], method["reward_std"][spread]
        self.reward_chart.extend("high", steps[spread], mean + std)
        self.reward_chart.extend("low", steps[spread], mean - std)
        for name, values in rewards.items():
            have = ~np.isnan(values)
            if have.any():
                self._reward_line(name)
                self.rewards_chart.extend(name, steps[have], values[have])

    # The StepMetrics field each single-field line draws.
    _field: ClassVar[dict[str, str]] = {
        "margin": "reward_margin",
        "accuracy": "reward_accuracy",
        "chosen": "chosen_logps",
        "rejected": "rejected_logps",
        "mean": "reward_mean",
        "length": "completion_length",
        "kl": "kl",
        "clip": "clip_fraction",
    }

    def _scalars(self, get):
        """(chart, line key, value of its field via `get(field)`, scale) for every single-field line."""
        charts = {
            "margin": (self.margin_chart, 1.0),
            "accuracy": (self.accuracy_chart, 100.0),  # a share, drawn as a percentage
            "chosen": (self.logps_chart, 1.0),
            "rejected": (self.logps_chart, 1.0),
            "mean": (self.reward_chart, 1.0),
            "length": (self.length_chart, 1.0),
            "kl": (self.kl_chart, 1.0),
            "clip": (self.clip_chart, 100.0),
        }
        return [(chart, key, get(self._field[key]), scale) for key, (chart, scale) in charts.items()]

    def _reward_line(self, name: str) -> None:
        if name not in self.rewards_chart.series:
            colour = REWARD_COLOURS[len(self.rewards_chart.series) % len(REWARD_COLOURS)]
            self.rewards_chart.add_line(name, str(name), colour, width=1.8)

    def _show(self, method: str) -> None:
        self.method = method
        for chart in self.preference:
            chart.setVisible(method == "preference")
        for chart in self.grpo:
            chart.setVisible(method == "grpo")
        self.samples_panel.setVisible(method == "grpo")
        self.setVisible(bool(method))
