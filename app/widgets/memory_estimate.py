"""The Train page's memory estimate: "needs ≈ X GiB of Y GiB on <GPU>" (on a computer without one: of the RAM
available), the peak's parts as a bar against the memory there is, and when it does not fit, one click to apply what
auto-fit found (or the nearest fix). Without a GPU a second line says how long the run takes on this CPU."""

from __future__ import annotations

import math

from PySide6.QtCore import QRectF, Qt, Signal
from PySide6.QtGui import QColor, QPainter
from PySide6.QtWidgets import QHBoxLayout, QPushButton, QVBoxLayout, QWidget

from hone.app.widgets.common import label, set_role

GIB = 1024**3
# One colour per part of the estimate, in the order MemoryEstimate lists them; the free rest is left unpainted.
PART_COLOURS = ("#5b8def", "#8e6bd8", "#2eb67d", "#e0a526", "#e8684a", "#9aa4b1")


class MemoryBar(QWidget):
    """Stacked parts of the predicted peak over the width of the available memory (or of the peak, if larger)."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setFixedHeight(12)
        self.parts: list[tuple[str, float]] = []
        self.available = 0.0

    def set_parts(self, parts: list[tuple[str, float]], available: float) -> None:
        self.parts, self.available = parts, available
        self.setToolTip("\n".join(f"{name}: {size / GIB:.2f} GiB" for name, size in parts))
        self.update()

    def paintEvent(self, event) -> None:
        painter = QPainter(self)
        painter.setRenderHint(QPainter.Antialiasing)
        width, height = float(self.width()), float(self.height())
        painter.setPen(Qt.NoPen)
        painter.setBrush(QColor(128, 128, 128, 50))
        painter.drawRoundedRect(QRectF(0, 0, width, height), 4, 4)
        total = max(self.available, sum(size for _, size in self.parts), 1.0)
        x = 0.0
        for (_, size), colour in zip(self.parts, PART_COLOURS):
            span = width * size / total
            painter.setBrush(QColor(colour))
            painter.drawRect(QRectF(x, 0, span, height))
            x += span
        if self.available and self.available < total:  # where the memory ends, over a bar that runs past it
            painter.setBrush(QColor("#d64545"))
            painter.drawRect(QRectF(width * self.available / total - 1, 0, 2, height))
        painter.end()


class MemoryEstimateView(QWidget):
    """Shows a RunPlan; `fix_requested` carries `section.key=value` assignments that make the run fit."""

    fix_requested = Signal(list)

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(6)
        self.text = label("Memory: estimating…", "muted", wrap=True)
        self.bar = MemoryBar()
        row = QHBoxLayout()
        row.addWidget(self.text, 1)
        self.fix_button = set_role(QPushButton(""), "preset")
        self.fix_button.hide()
        self.fix_button.clicked.connect(lambda: self.fix_requested.emit(list(self._fix)))
        row.addWidget(self.fix_button)
        layout.addLayout(row)
        layout.addWidget(self.bar)
        self.time_text = label("", "muted", wrap=True)
        self.time_text.hide()
        layout.addWidget(self.time_text)
        self._fix: list[str] = []
        self.fits: bool | None = None

    def show_waiting(self, message: str) -> None:
        self.fits = None
        self._set_text(message, "muted")
        self.bar.set_parts([], 0.0)
        self.fix_button.hide()

    def show_failure(self, message: str) -> None:
        self.fits = None
        self._set_text(f"Memory: cannot estimate ({message}).", "muted")
        self.bar.set_parts([], 0.0)
        self.fix_button.hide()

    def show_plan(self, plan) -> None:
        estimate, memory, fit = plan.estimate, plan.memory, plan.fit
        spare = getattr(plan, "spare", None)  # with memory to spare: whole MLPs, layers that keep their activations
        if spare is not None:
            estimate = spare.estimate
        notes = " " + " ".join(f"{note[0].upper()}{note[1:]}." for note in fit.notes) if fit and fit.notes else ""
        if notes and fit.fits and not fit.changes:  # the plan counts inputs kept on the GPU: its own estimate
            estimate = fit.estimate
        parts = [(part.name, part.bytes) for part in estimate.parts]
        self.bar.set_parts(parts, memory.available if memory else 0.0)
        self._fix = []
        if memory is not None and not memory.gpu:
            self._show_ram(plan)
        elif memory is None:
            self.fits = None
            self._set_text(
                f"Needs ≈ {estimate.peak_gib:.1f} GiB on an NVIDIA GPU (none here: this run will use the CPU).", "muted"
            )
        elif fit.fits and not fit.changes:
            self.fits = True
            self._set_text(
                f"Needs ≈ {estimate.peak_gib:.1f} GiB of {memory.available / GIB:.1f} GiB on "
                f"{memory.device}."
                + (f" With this much to spare {spare.words()} (faster)." if spare is not None else "")
                + notes,
                "muted",
            )
        elif fit.fits:
            self.fits = False
            self._fix = fit.assignments(plan.settings)
            self._set_text(
                f"Needs ≈ {estimate.peak_gib:.1f} GiB: more than the {memory.available / GIB:.1f} GiB "
                f"on {memory.device}. It fits ({fit.estimate.peak_gib:.1f} GiB) with: " + "; ".join(fit.changes) + ".",
                "error",
            )
        else:
            self.fits = False
            if fit.largest_max_length:
                self._fix = [f"data.max_length={fit.largest_max_length}"]
            self._set_text(
                f"Needs ≈ {estimate.peak_gib:.1f} GiB: does not fit the {memory.available / GIB:.1f} GiB "
                f"free on {memory.device}. {fit.reason}.",
                "error",
            )
        self.fix_button.setText("Apply the fix" if fit is None or fit.fits else "Use shorter rows")
        self.fix_button.setToolTip("\n".join(self._fix))
        self.fix_button.setVisible(bool(self._fix))

    def _show_ram(self, plan) -> None:
        """The run against the system memory available: a run on the CPU."""
        estimate, available, fit = plan.estimate, plan.memory.available / GIB, plan.fit
        need = f"Needs ≈ {estimate.peak_gib:.1f} GiB of RAM"
        if fit.fits and not fit.changes:
            self.fits = True
            self._set_text(f"{need}; {available:.1f} GiB available on this computer.", "muted")
            return
        self.fits = False
        if fit.fits:
            self._fix = fit.assignments(plan.settings)
            self._set_text(
                f"{need}: more than the {available:.1f} GiB of RAM available on this computer. It fits "
                f"({fit.estimate.peak_gib:.1f} GiB) with: " + "; ".join(fit.changes) + ".",
                "error",
            )
        else:
            if fit.largest_max_length:
                self._fix = [f"data.max_length={fit.largest_max_length}"]
            self._set_text(
                f"{need}: does not fit the {available:.1f} GiB of RAM available on this computer. {fit.reason}.",
                "error",
            )

    def show_time(self, estimate, no_time: str = "") -> None:
        """The run's time on this CPU (a TimeEstimate), or why there is none."""
        if estimate is None:
            end = "" if no_time.endswith(("…", ".")) else "."
            self.time_text.setText(f"Time: {no_time}{end}" if no_time else "")
            self.time_text.setToolTip("")
        else:
            self.time_text.setText(
                f"Time: {duration_text(estimate.low_s, estimate.high_s)} on this CPU, for {estimate.tokens:,} tokens."
            )
            self.time_text.setToolTip(
                f"≈ {estimate.flops:.2g} floating-point operations in all, at this CPU's "
                f"{estimate.flops_per_s / 1e9:.0f} GFLOP/s measured here (a short matrix-multiply test), of which a "
                "training step reaches a share. Other programs running at the same time make it slower."
            )
        self.time_text.setVisible(bool(self.time_text.text()))

    def hide_time(self) -> None:
        self.time_text.setText("")
        self.time_text.hide()

    def _set_text(self, text: str, role: str) -> None:
        self.text.setText(text)
        set_role(self.text, role)


def duration_text(low_s: float, high_s: float) -> str:
    """A range of seconds in words a person plans with: "about 20–45 min", "about 0.5–2.5 h", "about 3–8 days".

    Minutes from 10 on round to fives, hours to halves below 10 and to whole hours above; the low end rounds down and
    the high end up, so the range only widens.
    """
    if high_s < 60:
        return "under a minute"
    if high_s < 100 * 60:
        low, high = max(1, math.floor(low_s / 60)), math.ceil(high_s / 60)
        if low >= 10:
            low = low // 5 * 5
        if high >= 10:
            high = math.ceil(high / 5) * 5
        unit = "min"
    elif high_s < 48 * 3600:
        low_h, high_h = low_s / 3600, high_s / 3600
        low = max(0.5, math.floor(low_h * 2) / 2) if low_h < 10 else math.floor(low_h)
        high = math.ceil(high_h * 2) / 2 if high_h < 10 else math.ceil(high_h)
        if low >= 3:  # "3–12 h", not "3.0–12 h": halves only where they matter
            low = math.floor(low)
        unit = "h"
    else:
        low, high = max(1, math.floor(low_s / 86400)), math.ceil(high_s / 86400)
        unit = "days"
    return f"about {high:g} {unit}" if low == high else f"about {low:g}–{high:g} {unit}"
