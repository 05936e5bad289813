"""How the Monitor tells a failed run: the reason in words and the next step, in a dialog (or, for training data that
changed under a resume, the two ways to go on).

A run in a child process (`hone train`) that fails before its first step has its folder removed with its
metrics.jsonl, so the RunFailed the Studio gets may only say that the process ended (exit code 1); the child printed
the real reason on its error output ("failed: …" / "advice: …", kept in the event's details), which is read back
here.
"""

from __future__ import annotations

from pathlib import Path

from PySide6.QtWidgets import QMessageBox, QWidget

from hone.app.workers import advice_for
from hone.core.events import RunFailed

# The reason hone.core.train.child_run gives when the child left no reason of its own.
ENDED_WITHOUT_WORDS = "the training process ended without finishing"
NEXT_STEP = "Check the run's settings, then start it again; its checkpoints, if any, resume from the Runs page."
NO_MESSAGES_NEXT_STEP = (
    "The process was ended from outside (out of memory, or killed). Resume the run from its newest checkpoint on "
    "the Runs page, or start it again from the Train page."
)
# What `hone train` prints for a failure (hone.core.cli.console.EventPrinter), each maybe wrapped over lines.
REASON_PREFIXES = ("failed: ", "interrupted: ")
ADVICE_PREFIX = "advice: "


def explain(event: RunFailed) -> tuple[str, str]:
    """(what happened, what to do next) of a failed run, in words for the dialog and the badge."""
    reason = str(event.reason)
    advice = str(event.advice or advice_for(reason))
    if reason.startswith(ENDED_WITHOUT_WORDS):
        said_reason, said_advice = printed_failure(str(event.details or ""))
        if said_reason:
            reason, advice = said_reason, said_advice or NEXT_STEP
        elif not str(event.details or "").strip():
            advice = NO_MESSAGES_NEXT_STEP  # "see the messages below" would point at nothing
    return reason, _sentence(advice) if advice else NEXT_STEP


def printed_failure(said: str) -> tuple[str, str]:
    """The reason and advice `hone train` printed for its failure on `said` (its error output), joined back from
    the lines the console wrapped them over; ("", "") when it printed none."""
    lines = said.splitlines()
    start = max((i for i, line in enumerate(lines) if line.startswith(REASON_PREFIXES)), default=None)
    if start is None:
        return "", ""
    parts: dict[str, list[str]] = {"reason": [], "advice": []}
    part = "reason"
    for index, line in enumerate(lines[start:]):
        if index == 0:
            line = next(line.removeprefix(p) for p in REASON_PREFIXES if line.startswith(p))
        elif line.startswith(ADVICE_PREFIX) and part == "reason":
            part, line = "advice", line.removeprefix(ADVICE_PREFIX)
        elif not line.strip() or line.startswith(("hone: ", "Traceback")):
            break
        parts[part].append(line.strip())
    return " ".join(parts["reason"]), " ".join(parts["advice"])


def failure_box(parent: QWidget, event: RunFailed) -> QMessageBox:
    """The failure's dialog (open, not modal): the reason, the next step, and the traceback or output on demand."""
    reason, next_step = explain(event)
    box = QMessageBox(QMessageBox.Warning, "Training failed", reason, QMessageBox.Ok, parent)
    box.setInformativeText(next_step)
    if event.details:
        box.setDetailedText(str(event.details))
    box.setModal(False)
    box.open()
    return box


def data_changed_box(parent: QWidget, event: RunFailed, on_choice) -> QMessageBox:
    """A resume found other training data than its checkpoint was trained on: offer the two ways on (the CLI's
    --data-changed) or leave the run as it is; `on_choice("restart-epoch" | "continue" | None)`."""
    box = QMessageBox(QMessageBox.Question, "The training data changed", str(event.reason), QMessageBox.Cancel, parent)
    box.setInformativeText(
        "Go on with this run on the data as it is now? Restarting the epoch begins it again on the new rows. "
        "Going on keeps the run's place in the data order, so some rows may come twice in this epoch, or not "
        "before the next. To train on the new data from the start, start a new run from the Train page."
    )
    restart = box.addButton("Restart the epoch", QMessageBox.AcceptRole)
    go_on = box.addButton("Go on where it stopped", QMessageBox.AcceptRole)
    choices = {restart: "restart-epoch", go_on: "continue"}
    box.buttonClicked.connect(lambda button: on_choice(choices.get(button)))
    box.setModal(False)
    box.open()
    return box


def resume_when_free(session, run_dir: Path, data_changed: str | None) -> None:
    """Resume `run_dir` on its changed data as chosen, once the failed attempt's thread has ended."""
    if data_changed is None:
        return
    if not session.is_running:
        session.resume_run(run_dir, data_changed=data_changed)
        return

    def when_ended(running: bool) -> None:
        if not running:
            session.running_changed.disconnect(when_ended)
            session.resume_run(run_dir, data_changed=data_changed)

    session.running_changed.connect(when_ended)


def _sentence(text: str) -> str:
    text = text.strip()
    return f"{text[:1].upper()}{text[1:]}" if text else ""
