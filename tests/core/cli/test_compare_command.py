"""`hone compare`: only the settings that differ, each run's numbers from its metrics.jsonl, damaged files named."""

from __future__ import annotations

import json
import shutil
import statistics

import pytest

from hone.core import events
from hone.core.cli.dispatch import main
from hone.core.train.trainer import Trainer
from tests.core.conftest import make_tiny_config


@pytest.fixture(scope="module")
def three_runs(tmp_path_factory, tiny_model_dir, chat_files):
    """Three finished 3-step CPU runs, evaluated at steps 1, 2 and 3: a, b (another lr), c (another LoRA rank)."""
    root = tmp_path_factory.mktemp("compare")
    model = tiny_model_dir("tiny-dense")
    changes = {"a": [], "b": ["train.lr=3e-3"], "c": ["lora.r=4"]}
    for name, overrides in changes.items():
        config = make_tiny_config(
            model, chat_files, root / "runs", f"output.name={name}", "train.eval_every=1", *overrides
        )
        got = list(Trainer(config, device="cpu").run())
        assert isinstance(got[-1], events.RunFinished), got[-1]
    return [root / "runs" / name for name in changes]


def _lines(run_dir, kind):
    """The raw JSON objects of one event kind in metrics.jsonl, read without Hone's readers."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text(encoding="utf-8").splitlines()]
    return [r for r in rows if r["event"] == kind]


def test_three_runs_compared_as_json_and_on_screen(three_runs, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "250")
    out = tmp_path / "cmp.json"
    assert main(["compare", *map(str, three_runs), "--json", str(out)]) == 0
    shown = capsys.readouterr().out
    data = json.loads(out.read_text(encoding="utf-8"))

    assert data["differing_settings"] == {"lora.r": [16, 16, 4], "train.lr": [1e-3, 3e-3, 1e-3]}
    assert [r["name"] for r in data["runs"]] == ["a", "b", "c"]
    for run_dir, run in zip(three_runs, data["runs"]):
        steps, evals = _lines(run_dir, "StepMetrics"), _lines(run_dir, "EvalMetrics")
        assert len(steps) == 3 and len(evals) == 3, (steps, evals)
        finished = _lines(run_dir, "RunFinished")[-1]
        m = run["metrics"]
        assert m["status"] == "finished" and m["steps"] == 3 and run["problems"] == []
        assert m["final_train_loss"] == steps[-1]["loss"]
        assert m["final_eval_loss"] == evals[-1]["loss"]
        assert m["best_eval_loss"] == min(e["loss"] for e in evals)
        assert m["best_eval_step"] == min(evals, key=lambda e: e["loss"])["step"]
        assert m["median_tokens_per_s"] == statistics.median(s["tokens_per_s"] for s in steps)
        assert m["wall_time_s"] == finished["elapsed"]
        assert m["peak_mem_allocated"] is None  # the CPU reports no device memory
    assert "settings that differ" in shown and "train.lr" in shown and "lora.r" in shown
    assert "data.max_length" not in shown  # the same in every run
    for run in data["runs"]:
        assert f"{run['metrics']['best_eval_loss']:.4f}" in shown


def test_damaged_files_are_named_and_the_rest_still_compared(three_runs, tmp_path, capsys):
    broken = tmp_path / "broken"
    shutil.copytree(three_runs[0], broken)
    (broken / "run.json").write_text("{half", encoding="utf-8")
    with open(broken / "metrics.jsonl", "a", encoding="utf-8") as f:
        f.write("not an event\n")
    (broken / "config.toml").write_text("[train\nlr = ", encoding="utf-8")
    out = tmp_path / "cmp.json"
    assert main(["compare", str(three_runs[1]), str(broken), "--json", str(out)]) == 0
    shown = capsys.readouterr().out
    data = json.loads(out.read_text(encoding="utf-8"))
    run = data["runs"][1]
    assert run["metrics"]["status"] == "damaged"
    problems = " ".join(run["problems"])
    assert "run.json" in problems and "1 line of metrics.jsonl could not be read" in problems
    assert "config.toml" in problems and "settings left out" in problems
    assert run["metrics"]["steps"] == 3  # the lines that hold events still count
    assert data["differing_settings"] == {}  # one readable config: nothing to differ from
    assert "damaged" in shown and "Traceback" not in shown


def test_refuses_a_folder_that_is_no_run_and_a_single_run(three_runs, tmp_path, capsys):
    assert main(["compare", str(three_runs[0]), str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert f"{tmp_path} is not a run folder" in err and "advice:" in err
    assert main(["compare", str(three_runs[0])]) == 2
    assert "two or more run folders" in capsys.readouterr().err
