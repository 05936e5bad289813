"""`hone studio --screenshot FILE --page NAME --size WxH` renders each page to a real, non-blank PNG."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

import numpy as np
import pytest
from PySide6.QtGui import QImage

from hone.app.studio_command import PAGES, parse_size


def _distinct_colours(image: QImage, x0: int = 0) -> int:
    """Distinct colours right of x0 (the sidebar is left of it); text alone brings dozens of antialiased shades."""
    image = image.convertToFormat(QImage.Format_RGB32)
    pixels = np.frombuffer(image.constBits(), np.uint32).reshape(image.height(), image.bytesPerLine() // 4)
    return len(np.unique(pixels[:, x0 : image.width()]))


def test_every_page_renders_a_non_blank_png(qapp, tmp_path):
    from hone.app.main import run

    for page in PAGES:
        path = tmp_path / f"{page}.png"
        args = argparse.Namespace(
            screenshot=str(path), page=page, size=(1100, 720), theme="light", model=None, data=None, run=None
        )
        assert run(args) == 0
        image = QImage(str(path))
        assert (image.width(), image.height()) == (1100, 720), page
        # a page has text, cards and widgets: many colours right of the sidebar, not one background
        assert _distinct_colours(image, x0=240) > 50, f"{page} looks blank"


def test_hone_studio_command_writes_the_screenshot(tmp_path):
    path = tmp_path / "train-dark.png"
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen", "HOME": str(tmp_path)}
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "hone.core.cli",
            "studio",
            "--screenshot",
            str(path),
            "--page",
            "train",
            "--size",
            "1024x700",
            "--theme",
            "dark",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=240,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    image = QImage(str(path))
    assert (image.width(), image.height()) == (1024, 700)
    assert _distinct_colours(image, x0=240) > 50
    # dark theme: the window background is dark
    assert QImage(str(path)).pixelColor(600, 690).lightness() < 80


def test_hone_studio_script_without_the_gui_packages_is_one_line_with_advice(monkeypatch, capsys, tmp_path):
    from hone.app.studio_command import main

    monkeypatch.setitem(sys.modules, "pyqtgraph", None)  # makes `import pyqtgraph` fail
    shot = tmp_path / "shot.png"
    assert main(["--screenshot", str(shot), "--page", "train"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("hone-studio: error: the desktop app cannot start") and "pyqtgraph" in err
    assert "hone-studio: advice: install the GUI dependencies" in err and not shot.exists()


@pytest.mark.parametrize("text, size", [("1440x900", (1440, 900)), ("800 X 600", (800, 600))])
def test_size_parsing(text, size):
    assert parse_size(text) == size


def test_bad_sizes_are_refused():
    for text in ("big", "10x10", "1440"):
        with pytest.raises(argparse.ArgumentTypeError, match="window size"):
            parse_size(text)


def test_a_run_folder_that_is_not_one_is_refused_before_the_window_opens(capsys, tmp_path):
    from hone.app.studio_command import main

    shot = tmp_path / "shot.png"
    assert main(["--screenshot", str(shot), "--page", "export", "--run", str(tmp_path / "no-such-run")]) == 2
    err = capsys.readouterr().err
    assert f"{tmp_path / 'no-such-run'} is not a run folder (it has no config.toml)" in err and not shot.exists()


def test_several_runs_open_the_first_and_are_compared_on_runs(qtbot, make_window, tmp_path):
    from test_runs_page import _finished

    from hone.app.main import apply_choices

    runs_dir = tmp_path / "runs"
    folders = [
        _finished(runs_dir / name, losses, 1000.0 + k)
        for k, (name, losses) in enumerate(
            (("lr-1e-4", [2.0, 1.5, 1.2]), ("lr-3e-4", [2.0, 1.2, 0.9]), ("lr-1e-3", [2.0, 1.4, 1.6]))
        )
    ]
    window = make_window()
    window.state.update(f'output.runs_dir="{runs_dir.as_posix()}"')
    args = argparse.Namespace(model=None, data=None, run=[str(folders[0]), str(folders[2])], screenshot=None)
    apply_choices(window, args)
    runs = window.page("runs")
    assert sorted(runs.selected_dirs()) == sorted([folders[0], folders[2]])
    view = runs.comparison
    qtbot.waitUntil(lambda: view.comparison is not None and not view.reading, timeout=30_000)
    assert len(view.comparison.runs) == 2 and view.isVisibleTo(runs)
    assert window.monitor.run_dir() == folders[0]


def test_runs_of_different_folders_are_refused(capsys, tmp_path):
    from hone.app.studio_command import main

    for name in ("a/one", "b/two"):
        (tmp_path / name).mkdir(parents=True)
        (tmp_path / name / "config.toml").write_text("", encoding="utf-8")
    shot = tmp_path / "shot.png"
    assert (
        main(
            [
                "--screenshot",
                str(shot),
                "--page",
                "runs",
                "--run",
                str(tmp_path / "a/one"),
                "--run",
                str(tmp_path / "b/two"),
            ]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert "the runs given with --run are in different runs folders" in err and not shot.exists()
