"""Data with no row a run can train on blocks Start on the Train page, with the reason on the form; the check runs
off the GUI thread. A run that fails anyway says the real reason and the next step in its dialog, not the child
process's exit code."""

from __future__ import annotations

import json
import threading

import pytest
from test_run_checks import GPU, _problems

from hone.core.events import RunFailed

GOOD_ROW = {"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]}


def _use(window, path) -> None:
    window.state.update(f"data.train=[{json.dumps(str(path))}]")


def _blocked(page) -> bool:
    return not page.start_button.isEnabled() and not page.data_check_pending()


@pytest.mark.parametrize(
    "content, said",
    [
        ("", "is empty (0 bytes)"),
        ('{"x": 1}\n{"y": 2}\n', "None of the 2 training rows can be trained on"),
    ],
    ids=["empty file", "every row bad"],
)
def test_data_without_a_usable_row_blocks_start_with_the_reason(qtbot, make_window, tmp_path, content, said):
    window = make_window(machine=GPU)
    page = window.page("train")
    data = tmp_path / "rows.jsonl"
    data.write_text(content)
    _use(window, data)
    assert page.data_check_pending(), "the rows are read on a worker thread, not in the window's"
    qtbot.waitUntil(lambda: _blocked(page), timeout=10_000)
    text = _problems(page)
    assert said in text and "rows.jsonl" in text, text
    assert "Data page" in text, "says where to fix it"
    page.start()
    assert not window.state.session.is_running

    data.write_text(json.dumps(GOOD_ROW) + "\n")  # fixed in the file: read again once the Train page is shown
    window.show_page("train")
    qtbot.waitUntil(lambda: page.start_button.isEnabled(), timeout=10_000)
    assert not _problems(page)


PAIR = {"prompt": "Which is right?", "chosen": " this one", "rejected": " that one"}
PROMPT = {"prompt": "What is 2 + 2?", "answer": "4"}


@pytest.mark.parametrize(
    "row, method, usable",
    [
        (PAIR, "dpo", True),
        (PAIR, "sft", False),
        (PROMPT, "grpo", True),
        ({"prompt": ""}, "grpo", False),
        (GOOD_ROW, "orpo", False),
    ],
    ids=["pairs for dpo", "pairs for sft", "prompts for grpo", "empty prompt for grpo", "chat rows for orpo"],
)
def test_the_check_reads_the_rows_as_the_chosen_method_does(qtbot, make_window, tmp_path, row, method, usable):
    """Pairs start a DPO run and GRPO prompts a GRPO run: the check asks what the run's method reads, not SFT rows."""
    window = make_window(machine=GPU)
    page = window.page("train")
    data = tmp_path / "rows.jsonl"
    data.write_text((json.dumps(row) + "\n") * 3)
    window.state.update('grpo.rewards=[{kind = "numeric", column = "answer"}]', f"train.method={method}")
    _use(window, data)
    qtbot.waitUntil(lambda: not page.data_check_pending(), timeout=10_000)
    text = _problems(page)
    if usable:
        assert "training rows" not in text and "rows.jsonl" not in text, text
    else:
        assert "None of the 3 training rows can be trained on" in text and "rows.jsonl" in text, text


def test_the_check_reads_the_rows_on_another_thread(qtbot, make_window, tmp_path, monkeypatch):
    import hone.app.data_readiness as readiness

    threads = []
    real = readiness.usable_rows_problems

    def spy(data_cfg, method):
        threads.append(threading.current_thread())
        return real(data_cfg, method)

    monkeypatch.setattr(readiness, "usable_rows_problems", spy)
    window = make_window(machine=GPU)
    page = window.page("train")
    data = tmp_path / "empty.jsonl"
    data.write_text("")
    _use(window, data)
    qtbot.waitUntil(lambda: _blocked(page), timeout=10_000)
    assert threads and all(t is not threading.main_thread() for t in threads)


def test_a_failed_child_run_says_the_reason_and_what_to_do(qtbot, make_window, tiny_model_dir, tmp_path):
    """Started past the form (a resume, the CLI's config): the child fails on the data before its first step and
    removes its folder; the dialog says why in words, not 'exit code 1'."""
    from test_train_gpus import ready_to_start

    window = make_window(machine=GPU)
    ready_to_start(window, tiny_model_dir)
    data = tmp_path / "bad.jsonl"
    data.write_text('{"x": 1}\n{"y": 2}\n')
    _use(window, data)
    monitor = window.monitor
    window.state.session.start(window.state.config)
    qtbot.waitUntil(lambda: not window.state.session.is_running, timeout=120_000)
    assert monitor.status == "failed"
    dialog = monitor.failure_dialog
    assert "none of the 2 training rows" in dialog.text().lower(), dialog.text()
    assert "exit code" not in dialog.text()
    assert "hone data check" in dialog.informativeText() or "Data page" in dialog.informativeText()
    assert window.badge.title.text() == "Failed" and "exit code" not in window.badge.detail.text()


def test_the_dialog_reads_the_reason_from_what_hone_train_printed(make_window, tiny_model_dir, tmp_path):
    """When the child's run folder is gone before its RunFailed is read, the Studio's event holds only the exit
    code and the child's error output (hone.core.train.child_run); the dialog finds the reason in that output."""
    import subprocess
    import sys

    from hone.core.config import RunConfig

    data = tmp_path / "bad.jsonl"
    data.write_text('{"x": 1}\n{"y": 2}\n')
    config = RunConfig().with_overrides(
        [
            f"model.name_or_path={json.dumps(str(tiny_model_dir('tiny-dense')))}",
            f"data.train=[{json.dumps(str(data))}]",
            f"output.runs_dir={json.dumps(str(tmp_path / 'runs'))}",
            "train.max_steps=2",
            "train.batch_tokens=256",
            "data.max_length=256",
        ]
    )
    config.save(tmp_path / "run.toml")
    child = subprocess.run(
        [sys.executable, "-m", "hone.core.cli", "train", str(tmp_path / "run.toml")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert child.returncode == 1, child.stderr[-2000:]
    window = make_window(machine=GPU)
    window.monitor.handle(
        RunFailed(
            reason=f"the training process ended without finishing (exit code {child.returncode})",
            advice="see the messages below; the run folder keeps its checkpoints (Resume on the Runs page)",
            details=child.stderr[-4000:],
        )
    )
    dialog = window.monitor.failure_dialog
    assert dialog.text().startswith("none of the 2 training rows in ") and "bad.jsonl is usable" in dialog.text()
    assert "  " not in dialog.text(), "the lines the console wrapped are joined back"
    assert "hone data check" in dialog.informativeText()


def test_a_failure_without_words_from_the_child_still_gives_a_next_step(make_window):
    window = make_window(machine=GPU)
    monitor = window.monitor
    monitor.handle(RunFailed(reason="the training process ended without finishing (exit code -9)", details=""))
    dialog = monitor.failure_dialog
    assert "ended" in dialog.text()
    next_step = dialog.informativeText()
    assert "Runs page" in next_step and "messages below" not in next_step, "no messages came: none to point at"
