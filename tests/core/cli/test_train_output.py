"""What `hone train` shows when nobody watches a terminal (nohup, CI, a log file), and what train.log holds."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from rich.console import Console

from hone.core import events
from hone.core.cli.console import dataset_table


def _rows(n: int) -> str:
    return "".join(
        json.dumps(
            {
                "messages": [
                    {"role": "user", "content": f"What is {i} + {i}?"},
                    {"role": "assistant", "content": str(2 * i)},
                ]
            }
        )
        + "\n"
        for i in range(n)
    )


@pytest.mark.slow
def test_piped_run_prints_step_lines_and_writes_a_readable_log(tmp_path, tiny_model_dir):
    (tmp_path / "train.jsonl").write_text(_rows(12) + "{broken\n", encoding="utf-8")
    (tmp_path / "run.toml").write_text(
        f'[model]\nname_or_path = "{tiny_model_dir("tiny-dense").as_posix()}"\n'
        '[data]\ntrain = ["train.jsonl"]\nmax_length = 64\n'
        "[train]\nmax_steps = 3\nbatch_tokens = 256\n"
        '[output]\nruns_dir = "runs"\nname = "r"\n',
        encoding="utf-8",
    )
    out = subprocess.run(
        [sys.executable, "-m", "hone.core.cli", "train", "run.toml"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "COLUMNS": "200"},
        timeout=300,
    )
    shown = out.stdout + out.stderr
    assert out.returncode == 0, shown
    for step in (1, 3):  # the first and the last step always get a line
        line = next(x for x in shown.splitlines() if x.startswith(f"step {step}/3"))
        assert "loss " in line and "tok/s" in line
    assert "embeddings: off (CPU)" in shown
    assert "gemm_4bit" not in shown and "is_gradient_checkpointing" not in shown

    log = (tmp_path / "runs" / "r" / "train.log").read_text(encoding="utf-8")
    for words in (
        "train data",
        "12 kept, 1 skipped (1 invalid JSON)",
        "started: ",
        "step 1/3  loss",
        "step 3/3  loss",
        "checkpoint at step 3",
        "finished after 3 steps",
    ):
        assert words in log, (words, log)
    assert "{'" not in log and "Notice:" not in log  # no raw event dicts


def test_data_table_counts_every_skipped_row_and_says_where_the_list_is():
    report = events.DatasetReport(
        split="train",
        files=["a.jsonl"],
        rows_read=10,
        rows_kept=3,
        skipped={"invalid JSON": 4, "empty content": 3},
        skipped_examples=[f"a.jsonl:{i}: bad" for i in range(1, 8)],
        notes=["1 row had two user turns in a row, merged into one turn (kept): a.jsonl:9"],
    )
    console = Console(record=True, width=200)
    console.print(dataset_table(report))
    text = console.export_text()
    assert "rows skipped" in text and " 7 " in text
    assert "a.jsonl:5: bad" in text and "a.jsonl:6: bad" not in text
    assert "7 rows skipped in all; `hone data check a.jsonl` lists every one" in text
    assert "merged into one turn" in text


def _step(step: int, total: int = 5) -> events.StepMetrics:
    return events.StepMetrics(
        step=step,
        total_steps=total,
        epoch=0.1,
        loss=2.5 - step / 10,
        lr=1e-4,
        grad_norm=1.0,
        tokens=100,
        trained_tokens=50,
        tokens_per_s=1000.0,
        step_time=0.1,
        elapsed=0.1 * (step - 2),
    )


def test_plain_console_prints_first_and_last_step_with_eta():
    from hone.core.cli.console import EventPrinter

    console = Console(record=True, width=200, force_terminal=False)
    printer = EventPrinter(console)
    printer.handle(
        events.RunStarted(
            run_dir="r",
            model="m",
            device="cpu",
            dtype="float32",
            params_total=10,
            params_trainable=1,
            total_steps=5,
            tokens_per_epoch=100,
            resumed_from_step=2,
            speed_paths={"embeddings": "on the GPU: only on a GPU (on the CPU ...)"},
        )
    )
    for step in (3, 4, 5):
        printer.handle(_step(step))
    text = console.export_text()
    assert "embeddings: off (CPU)" in text and "resumed from step 2" in text
    assert "step 3/5  loss 2.2000" in text and "ETA 0:00:00" in text and "step 5/5" in text
    assert "step 4/5" not in text  # within PLAIN_STEP_EVERY_S of the last line


def test_train_log_is_words_not_dicts(tmp_path):
    from hone.core.config import RunConfig
    from hone.core.train.run_dir import RunWriter

    writer = RunWriter(tmp_path, RunConfig())
    started = events.RunStarted(
        run_dir=str(tmp_path),
        model="m",
        device="cpu",
        dtype="float32",
        params_total=10,
        params_trainable=1,
        total_steps=5,
        tokens_per_epoch=100,
        resumed_from_step=2,
    )
    notice = events.Notice(topic="resume", message="continuing")
    for event in (
        started,
        notice,
        _step(3),
        _step(4),
        _step(5),
        events.EvalMetrics(step=5, loss=1.5, tokens=9),
        events.CheckpointSaved(step=5, path="ck/step-5"),
        events.RunFinished(step=5, run_dir="r", adapter_dir="r/adapter", final_loss=2.0, elapsed=3.0),
    ):
        writer.write(event)
    writer.close()
    log = (tmp_path / "train.log").read_text(encoding="utf-8")
    assert "resumed from step 2: m on cpu" in log and "note: resume: continuing" in log
    assert "step 3/5" in log and "step 4/5" not in log and "step 5/5" in log
    assert "eval at step 5: loss 1.5000" in log and "checkpoint at step 5: ck/step-5" in log
    assert "finished after 5 steps in 3 s: final loss 2.0000" in log and "{'" not in log


def test_a_run_the_machine_cut_off_is_interrupted_not_failed():
    from hone.core.cli.console import EventPrinter

    console = Console(record=True, width=200, force_terminal=False)
    printer = EventPrinter(console)
    printer.handle(
        events.RunFailed(
            reason="the GPU stopped working in step 8 (CUDA error: an illegal memory access)",
            advice="hone train --resume r",
            step=7,
            interrupted=True,
        )
    )
    printer.handle(events.RunFailed(reason="the data has no usable rows", advice="fix the rows"))
    lines = console.export_text().splitlines()
    assert lines[0].startswith("interrupted: the GPU stopped working"), lines
    assert "failed" not in lines[0] and lines[1] == "advice: hone train --resume r"
    assert lines[2] == "failed: the data has no usable rows", lines
