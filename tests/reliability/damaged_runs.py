"""A corpus of damaged run folders, as disks, copies, editors and hostile hands leave them, beside valid runs.

Each folder is first written by core's RunWriter as a real run writes it; then one file is damaged. `RUN_JSON`
damages run.json (what the run history reads), `METRICS` adds lines to metrics.jsonl that no Hone writes (what the
Monitor and the Runs page read). Used by tests/reliability/test_damaged_run_files.py (the core readers) and
test_damaged_runs_studio.py (the Studio over the whole corpus).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from hone.core import events
from hone.core.config import RunConfig

MODEL = "bundled:tiny"
T0 = 1_700_000_000.0  # when the corpus's runs "started": a fixed time, so the order of valid runs is known


def valid_summary(run_dir: Path, **changes) -> dict:
    """run.json as a finished two-step run writes it, with `changes`."""
    data = {
        "run_dir": str(run_dir),
        "name": run_dir.name,
        "model": MODEL,
        "status": "finished",
        "step": 2,
        "total_steps": 2,
        "final_loss": 1.5,
        "eval_loss": None,
        "started": T0,
        "updated": T0 + 5,
        "reason": "",
    }
    return {**data, **changes}


def _json(data) -> bytes:
    return json.dumps(data).encode("utf-8")


# run.json as it may be found: name -> (bytes, the field or fact the reason names). `run_dir` is filled in by
# `write_run_json`; bytes are built from a template where a field is damaged.
RUN_JSON: dict[str, tuple[object, str]] = {
    "not-utf8": ({"model": "bundled:tiny\udcff"}, "not UTF-8"),
    "a-list": (b"[1, 2, 3]", "a JSON array"),
    "a-string": (b'"finished"', "a JSON string"),
    "cut-short": (b'{"status": "fini', "not valid JSON"),
    "empty": (b"", "not valid JSON"),
    "deeply-nested": (b"[" * 200_000 + b"]" * 200_000, "nested"),
    "started-yesterday": ({"started": "yesterday"}, "started is 'yesterday', not a time"),
    "started-1e300": ({"started": 1e300}, "started is 1e+300, not a time"),
    "started-nan": ({"started": float("nan")}, "started is NaN, not a time"),
    "loss-infinite": ({"final_loss": float("inf")}, "final_loss is Infinity, not a finite number"),
    "step-abc": ({"step": "abc"}, "step is 'abc', not a whole number"),
    "step-negative": ({"step": -3}, "step is -3, below 0"),
    "step-true": ({"step": True}, "step is true, not a whole number"),
    "model-5": ({"model": 5}, "model is 5, not text"),
    "status-null": ({"status": None}, "status is null, not text"),
    "status-unknown": ({"status": "exploded"}, "status is 'exploded', not one of"),
    "reason-a-list": ({"reason": ["a"]}, 'reason is ["a"], not text'),
    "missing-fields": ({"model": ..., "status": ...}, "model is missing; status is missing"),
    "huge": ({"reason": "x" * 3_000_000}, "run.json is 3,000,"),
    "a-folder": (None, "not a file"),
}


def run_json_bytes(run_dir: Path, case: str) -> bytes | None:
    template, _ = RUN_JSON[case]
    if isinstance(template, bytes) or template is None:
        return template
    data = {k: v for k, v in valid_summary(run_dir, **template).items() if v is not ...}
    if case == "not-utf8":  # a byte that is no UTF-8, inside an otherwise valid summary
        return json.dumps(data, ensure_ascii=False).encode("utf-8", "surrogateescape")
    return json.dumps(data).encode("utf-8")  # NaN and Infinity as Python writes them (not strict JSON)


# Lines appended to a failed run's metrics.jsonl: name -> line (bytes, without its newline).
_STEP = {
    "event": "StepMetrics",
    "time": T0 + 1,
    "step": 3,
    "total_steps": 4,
    "epoch": 0.5,
    "loss": 1.0,
    "lr": 1e-4,
    "grad_norm": 1.0,
    "tokens": 10,
    "trained_tokens": 5,
    "tokens_per_s": 100.0,
    "step_time": 0.1,
    "elapsed": 0.3,
}
METRICS: dict[str, bytes] = {
    "failed-reason-5": _json({"event": "RunFailed", "time": T0 + 2, "reason": 5, "advice": "x", "step": 3}),
    "failed-reason-list": _json({"event": "RunFailed", "time": T0 + 2, "reason": ["a"], "step": 3}),
    "loss-x": _json({**_STEP, "loss": "x"}),
    "step-true": _json({**_STEP, "step": True}),
    "step-float": _json({**_STEP, "step": 3.5}),
    "time-string": _json({**_STEP, "time": "now"}),
    "time-infinite": json.dumps({**_STEP, "time": float("inf")}).encode(),
    "expert-load-strings": _json({**_STEP, "expert_load": ["a", "b"]}),
    "skipped-counts-text": _json(
        {
            "event": "DatasetReport",
            "split": "train",
            "files": ["f"],
            "rows_read": 1,
            "rows_kept": 1,
            "skipped": {"a": "b"},
        }
    ),
    "config-a-string": _json(
        {
            "event": "RunStarted",
            "run_dir": "r",
            "model": "m",
            "device": "cpu",
            "dtype": "float32",
            "params_total": 1,
            "params_trainable": 1,
            "total_steps": 4,
            "tokens_per_epoch": 1,
            "config": "x",
        }
    ),
    "unknown-kind": _json({"event": "Exploded", "step": 3}),
    "kind-a-list": _json({"event": ["RunFailed"], "reason": "x"}),
    "no-kind": _json({"reason": "x"}),
    "a-list": b'["RunFailed", "x"]',
    "a-number": b"5",
    "missing-fields": _json({"event": "StepMetrics", "step": 3}),
    "not-utf8": b'{"event": "Notice", "topic": "x", "message": "\xff\xfe"}',
    "not-json": b'{"event": "Notice", "topic": ',
    "huge": _json({"event": "Notice", "topic": "x", "message": "y" * 9_000_000}),
    "deeply-nested": b'{"event": "Notice", "topic": "x", "message": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
}


def write_run(run_dir: Path, *, status: str = "finished", started: float = T0, losses=(2.0, 1.5)) -> Path:
    """A real run folder (config.toml, metrics.jsonl, train.log, run.json), written by RunWriter."""
    from hone.core.train.run_dir import RunWriter

    total = len(losses)
    writer = RunWriter(run_dir, RunConfig())
    writer.summary.started = started
    said: list[events.Event] = [
        events.RunStarted(
            run_dir=str(run_dir),
            model=MODEL,
            device="cpu",
            dtype="float32",
            params_total=10,
            params_trainable=1,
            total_steps=total,
            tokens_per_epoch=100,
            time=started,
        )
    ]
    said += [
        events.StepMetrics(
            step=s,
            total_steps=total,
            epoch=s / total,
            loss=loss,
            lr=1e-4,
            grad_norm=1.0,
            tokens=10,
            trained_tokens=5,
            tokens_per_s=100.0,
            step_time=0.1,
            elapsed=0.1 * s,
            time=started + s,
        )
        for s, loss in enumerate(losses, 1)
    ]
    if status == "failed":
        said.append(events.RunFailed(reason="the GPU ran out of memory", advice="lower it", step=total))
    else:
        said.append(
            events.RunFinished(
                step=total, run_dir=str(run_dir), adapter_dir="", final_loss=losses[-1], elapsed=1.0, time=started + 9
            )
        )
    for event in said:
        writer.write(event)
    writer.close()
    return run_dir


def write_damaged_run_json(run_dir: Path, case: str, *, mtime: float | None = None) -> Path:
    """A finished run whose run.json is then damaged as `case` says; the folder's mtime set to `mtime`."""
    write_run(run_dir)
    path = run_dir / "run.json"
    data = run_json_bytes(run_dir, case)
    path.unlink()
    if data is None:
        path.mkdir()
    else:
        path.write_bytes(data)
    if mtime is not None:
        os.utime(run_dir, (mtime, mtime))
    return run_dir


def write_damaged_metrics(run_dir: Path, cases, *, started: float = T0) -> Path:
    """A failed run whose metrics.jsonl ends with the lines of `cases`, then one valid Notice."""
    write_run(run_dir, status="failed", started=started)
    with open(run_dir / "metrics.jsonl", "ab") as f:
        for case in cases:
            f.write(METRICS[case] + b"\n")
        f.write(_json({"event": "Notice", "time": T0 + 3, "topic": "end", "message": "the last line"}) + b"\n")
    return run_dir


def write_corpus(runs: Path) -> dict[str, Path]:
    """Every damaged case beside two valid runs: name -> folder. "bad-metrics" holds every damaged line of `METRICS`,
    "bad-failure" ends with the RunFailed lines whose reason is no text. A damaged run.json's folder gets an mtime
    after the valid runs' start, one second apart per case in the order of `RUN_JSON`."""
    folders = {
        "valid-old": write_run(runs / "valid-old", started=T0 - 1000),
        "valid-new": write_run(runs / "valid-new", started=T0 + 1000, losses=(3.0, 2.0, 1.0)),
        "bad-failure": write_damaged_metrics(
            runs / "bad-failure", ["failed-reason-5", "failed-reason-list"], started=T0 + 500
        ),
        "bad-metrics": write_damaged_metrics(runs / "bad-metrics", list(METRICS)),
    }
    now = time.time()
    for i, case in enumerate(RUN_JSON):
        folders[f"json-{case}"] = write_damaged_run_json(runs / f"json-{case}", case, mtime=now - 100 + i)
    return folders
