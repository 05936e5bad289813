"""Train a finished run further: the Runs page's and the Monitor's "Train more steps…".

A run that reached train.max_steps has nothing left to resume (a plain resume would stop at once on its own length);
going on is a resume with train.max_steps raised, as `hone train --resume RUN_DIR --set train.max_steps=M` does. The
learning-rate schedule is laid out anew over the new steps (hone.core.train.resume_checks), and the Monitor keeps the
steps already trained on its charts (it reads them from the run folder when the resumed run starts).
"""

from __future__ import annotations

from pathlib import Path

from PySide6.QtWidgets import QInputDialog, QMessageBox, QWidget

from hone.core.errors import HoneError

MAX_MORE_STEPS = 10_000_000  # the dialog's bound only; any run longer is a command-line job


def ask_more_steps(parent: QWidget, name: str, step: int) -> int:
    """How many steps more to train the run `name`, which ended at `step` (0: cancelled)."""
    steps, ok = QInputDialog.getInt(
        parent,
        "Train more steps",
        f"“{name}” ended at step {step:,}. Train how many steps more? "
        "The learning-rate schedule is laid out anew over them.",
        max(1, step),
        1,
        MAX_MORE_STEPS,
    )
    return steps if ok else 0


def train_more(parent: QWidget, state, run_dir: Path, ended_at: int, steps: int) -> bool:
    """Resume the finished run in `run_dir` with train.max_steps = `ended_at` + `steps` and show it on the Monitor;
    a config.toml that cannot be read is said in a dialog, and nothing starts (False)."""
    if state.session.is_running:
        return False
    try:
        state.session.resume_run(Path(run_dir), max_steps=ended_at + steps)
    except HoneError as e:
        advice = f"\n\nWhat to do: {e.advice[:1].upper()}{e.advice[1:]}" if e.advice else ""
        QMessageBox.warning(parent, "Train more steps", f"{e.message}{advice}")
        return False
    state.page_requested.emit("monitor")
    return True
