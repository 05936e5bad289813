"""`hone` as a user meets it: version, help, and user mistakes as one line plus advice (exit 2)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from hone.core import __version__
from hone.core.cli import main


def test_version_and_help_run_without_torch():
    out = subprocess.run([sys.executable, "-c", "import sys; from hone.core.cli import main\n"
                          "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
                          "print('torch' in sys.modules)"], capture_output=True, text=True, check=True)
    assert "train" in out.stdout and "demo" in out.stdout
    assert out.stdout.strip().endswith("False")  # `hone --help` stays fast: no torch import
    with pytest.raises(SystemExit):
        main(["--version"])


def test_version_string(capsys):
    with pytest.raises(SystemExit):
        main(["--version"])
    assert capsys.readouterr().out.strip() == f"hone {__version__}"


@pytest.mark.parametrize("argv, message", [
    (["train", "missing.toml"], "config file missing.toml does not exist"),
    (["train"], "no config given"),
    (["train", "--resume", "."], "is not a run folder"),
])
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
