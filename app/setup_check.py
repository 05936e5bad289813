"""On start, check in the background that PyTorch works on this machine's GPU, and say in plain words what is
wrong and what to do (a broken install, a CPU build on a GPU machine, a driver too old for the build).

Errors are shown at every start until fixed; a warning (no GPU, CPU build) once per version of Hone.
"""

from __future__ import annotations

from PySide6.QtWidgets import QMessageBox, QWidget

from hone.app.helper_process import in_helper
from hone.app.settings import Settings
from hone.app.workers import Task
from hone.core.version import __version__

SEEN_KEY = "setup/warnings_seen"


def start_setup_check(window: QWidget, settings: Settings) -> Task:
    """Run the check in the helper process (it imports torch and touches the GPU, which the window's process never
    does); the answer, if it needs one, opens a dialog."""
    from hone.core.api import check_runtime

    return Task(in_helper(check_runtime), on_result=lambda findings: show_findings(window, settings, findings))


def show_findings(window: QWidget, settings: Settings, findings) -> QMessageBox | None:
    """Open a dialog for the findings that need the user; None when nothing does."""
    errors = [f for f in findings if f.level == "error"]
    seen = set(settings.list_value(SEEN_KEY))
    warnings = [f for f in findings if f.level == "warning" and _key(f) not in seen]
    shown = errors or warnings
    if not shown:
        return None
    box = QMessageBox(window)
    box.setObjectName("SetupCheck")
    box.setIcon(QMessageBox.Critical if errors else QMessageBox.Warning)
    box.setWindowTitle("Hone Studio: check your setup" if errors else "Hone Studio")
    box.setText("\n\n".join(f.title for f in shown))
    box.setInformativeText("\n\n".join(f.fix for f in shown if f.fix))
    details = "\n".join(f.detail for f in shown if f.detail)
    if details:
        box.setDetailedText(details)
    box.setStandardButtons(QMessageBox.Ok)
    if not errors:
        settings.set_list_value(SEEN_KEY, sorted(seen | {_key(f) for f in warnings}))
    box.open()  # not modal to the whole app: the user can still look around (and train on the CPU)
    return box


def _key(finding) -> str:
    return f"{__version__}:{finding.title}"
