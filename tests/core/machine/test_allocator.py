"""The CUDA allocator setting `hone` starts with: expandable segments on Linux, a user's own setting kept."""

from __future__ import annotations

import os

import pytest

from hone.core.cli import main
from hone.core.machine.allocator import ALLOC_ENV, ALLOC_ENVS, EXPANDABLE, prefer_expandable_segments


def test_linux_gets_expandable_segments():
    environ: dict[str, str] = {}
    assert prefer_expandable_segments(environ, "linux")
    assert environ == {ALLOC_ENV: EXPANDABLE}


@pytest.mark.parametrize("name", ALLOC_ENVS)
def test_a_setting_the_user_gave_is_kept(name):
    environ = {name: "max_split_size_mb:256"}
    assert not prefer_expandable_segments(environ, "linux")
    assert environ == {name: "max_split_size_mb:256"}


@pytest.mark.parametrize("platform", ["win32", "darwin"])
def test_other_platforms_are_left_alone(platform):
    environ: dict[str, str] = {}
    assert not prefer_expandable_segments(environ, platform)
    assert environ == {}


def test_the_command_line_sets_it_before_any_command_runs(monkeypatch, capsys):
    monkeypatch.setattr("sys.platform", "linux")
    for name in ALLOC_ENVS:
        monkeypatch.setenv(name, "")  # recorded, so the teardown restores what was there
        monkeypatch.delenv(name)
    assert main(["bench", "--list"]) == 0
    assert os.environ[ALLOC_ENV] == EXPANDABLE
    assert "scenarios" in capsys.readouterr().out
