"""The setup check on start: a dialog in plain words for errors (every start) and warnings (once per version)."""

from __future__ import annotations

from hone.app.setup_check import show_findings, start_setup_check
from hone.core.install.runtime import ERROR, OK, WARNING, Finding

OLD_DRIVER = Finding(
    ERROR, "The NVIDIA driver 560.94 is too old for this PyTorch.", "Update the driver.", "torch 2.11.0+cu130"
)
CPU_ONLY = Finding(WARNING, "No NVIDIA GPU was found: training runs on the CPU.", "Install the driver.")


def test_an_error_is_shown_at_every_start(make_window, settings):
    window = make_window()
    for _ in range(2):
        box = show_findings(window, settings, [OLD_DRIVER])
        assert box is not None and box.isVisible()
        assert box.text() == OLD_DRIVER.title and box.informativeText() == "Update the driver."
        assert box.detailedText() == "torch 2.11.0+cu130"
        box.close()


def test_a_warning_is_shown_once(make_window, settings):
    window = make_window()
    box = show_findings(window, settings, [CPU_ONLY])
    assert box is not None and box.text() == CPU_ONLY.title
    box.close()
    assert show_findings(window, settings, [CPU_ONLY]) is None


def test_nothing_to_say_when_all_is_well(make_window, settings):
    assert show_findings(make_window(), settings, [Finding(OK, "Ready to train on NVIDIA H200.")]) is None


def test_the_check_runs_in_the_background_on_this_machine(qtbot, make_window, settings):
    import torch
    from PySide6.QtWidgets import QMessageBox

    window = make_window()
    task = start_setup_check(window, settings)
    qtbot.waitUntil(lambda: not task.is_running(), timeout=60_000)
    assert task.error is None
    [finding] = task.value
    if torch.version.cuda is None:  # a CPU build: a warning dialog (no GPU, or a GPU the build cannot use)
        assert finding.level == WARNING
        box = window.findChild(QMessageBox, "SetupCheck")
        assert box is not None and box.isVisible() and box.text() == finding.title
