"""`hone` as a user meets it: version, help, and user mistakes as one line plus advice (exit 2)."""

from __future__ import annotations

import re
import subprocess
import sys
from importlib.metadata import Distribution

import pytest

from hone.core.cli import dispatch as cli
from hone.core.cli import main
from hone.core.version import __version__


def test_version_and_help_run_without_torch():
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from hone.core.cli import main\n"
            "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
            "print('torch' in sys.modules)",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "train" in out.stdout and "demo" in out.stdout
    assert out.stdout.strip().endswith("False")  # `hone --help` stays fast: no torch import
    with pytest.raises(SystemExit):
        main(["--version"])


def test_version_string(capsys):
    with pytest.raises(SystemExit):
        main(["--version"])
    assert capsys.readouterr().out.strip() == f"hone {__version__}"


@pytest.mark.parametrize(
    "argv, message",
    [
        (["train", "missing.toml"], "config file missing.toml does not exist"),
        (["train"], "no config given"),
        (["train", "--resume", "."], "is not a run folder"),
    ],
)
def test_user_mistakes_are_one_line_with_advice(argv, message, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and "hone: advice:" in err and "Traceback" not in err


def test_bad_override_names_the_field(capsys, tmp_path):
    config = tmp_path / "c.toml"
    config.write_text("[train]\nlr = 1e-4\n")
    assert main(["train", str(config), "--set", "train.lr=fast"]) == 2
    assert "train.lr" in capsys.readouterr().err


def _command_names(help_text: str) -> list[str]:
    """The subcommands `hone --help` lists, in its order."""
    return re.findall(r"^ {4}(\w+)\s", help_text, flags=re.MULTILINE)


def test_help_lists_built_in_commands_then_studio(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    assert _command_names(capsys.readouterr().out) == [
        "train",
        "demo",
        "bench",
        "data",
        "export",
        "push",
        "chat",
        "generate",
        "eval",
        "compare",
        "init",
        "plan",
        "models",
        "studio",
    ]


def test_studio_help_comes_from_the_entry_point_without_qt_or_torch():
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from hone.core.cli import main\n"
            "try:\n    main(['studio', '--help'])\nexcept SystemExit:\n    pass\n"
            "print(sorted({m.split('.')[0] for m in sys.modules} & "
            "{'torch', 'PySide6', 'shiboken6', 'pyqtgraph'}))",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "--screenshot" in out.stdout and "--page" in out.stdout  # the app's own options reached `hone`
    assert out.stdout.strip().endswith("[]")


def test_studio_without_the_gui_packages_is_one_line_with_advice(capsys, monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "PySide6.QtWidgets", None)  # makes `import PySide6.QtWidgets` fail
    shot = tmp_path / "shot.png"
    assert main(["studio", "--screenshot", str(shot)]) == 2
    err = capsys.readouterr().err
    assert "the desktop app cannot start" in err and "PySide6.QtWidgets" in err
    assert "hone: advice: install the GUI dependencies: pip install pyside6-essentials pyqtgraph" in err
    assert "Traceback" not in err and not shot.exists()


class _Plugin(Distribution):
    """An installed package as importlib.metadata sees it: a name and an entry_points.txt."""

    def __init__(self, name: str, entry_points_txt: str):
        self._files = {
            "METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n",
            "entry_points.txt": entry_points_txt,
        }

    def read_text(self, filename):
        return self._files.get(filename)

    def locate_file(self, path):
        return path


def test_a_broken_entry_point_leaves_the_other_commands_working(capsys, monkeypatch, tmp_path):
    plugin = _Plugin(
        "hone-broken-plugin", "[hone.commands]\nbroken = hone_tests_no_such_module\ntrain = hone_tests_no_such_module\n"
    )  # a plugin cannot replace a built-in command
    installed = list(cli.distributions())
    monkeypatch.setattr(cli, "distributions", lambda: [plugin, *installed])
    with pytest.raises(SystemExit):
        main(["--help"])
    assert _command_names(capsys.readouterr().out) == [*cli.COMMANDS, "broken", "studio"]

    assert main(["broken", "--any", "options"]) == 2
    err = capsys.readouterr().err
    assert "the `hone broken` command (hone_tests_no_such_module) cannot be loaded: ModuleNotFoundError" in err
    assert "hone: advice: reinstall hone-broken-plugin" in err and "Traceback" not in err

    monkeypatch.chdir(tmp_path)
    assert main(["train", "missing.toml"]) == 2  # the built-in train, not the plugin's
    assert "config file missing.toml does not exist" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:  # only the unloadable command takes any arguments
        main(["train", "missing.toml", "--no-such-flag"])
    assert exit_info.value.code == 2 and "unrecognized arguments: --no-such-flag" in capsys.readouterr().err


def test_without_entry_points_the_built_in_commands_remain(capsys, monkeypatch):
    monkeypatch.setattr(cli, "distributions", lambda: [])
    with pytest.raises(SystemExit):
        main(["--help"])
    assert _command_names(capsys.readouterr().out) == list(cli.COMMANDS)
