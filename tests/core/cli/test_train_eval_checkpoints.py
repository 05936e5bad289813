"""train.eval_checkpoints: `hone train` scores every checkpoint of the run and the base once the run has ended, with
the model it trained, into scores.json: the same entries `hone eval RUN --checkpoints all` writes for a copy of the
run that has no scores yet (that command loads the model afresh), and stored so that it then rescores nothing."""

from __future__ import annotations

import json
import shutil

import pytest


def test_a_run_with_eval_checkpoints_scores_each_checkpoint_as_hone_eval_does(
    tiny_model_dir, chat_files, tiny_config, tmp_path, capsys, monkeypatch
):
    from hone.core.cli import main

    config = tiny_config(
        tiny_model_dir("tiny-dense"),
        chat_files,
        tmp_path / "runs",
        "train.max_steps=3",
        "train.lr=2e-2",
        "output.checkpoint_every=1",
        "output.keep_checkpoints=3",
        "train.eval_checkpoints=true",
        "output.name=scored",
    )
    path = tmp_path / "run.toml"
    config.save(path)
    assert main(["train", str(path)]) == 0
    out = capsys.readouterr()
    assert "scores stored in" in out.err and "* best by loss" in out.out
    run_dir = tmp_path / "runs" / "scored"
    stored = json.loads((run_dir / "scores.json").read_text())
    by_step = {e["checkpoint"]: e for e in stored["entries"]}
    assert sorted(by_step, key=lambda s: -1 if s is None else s) == [None, 1, 2, 3]

    # The same run folder without scores, scored by `hone eval --checkpoints all` (a fresh model from disk).
    copy = tmp_path / "copy" / "scored"
    shutil.copytree(run_dir, copy, ignore=shutil.ignore_patterns("scores.json", "run.lock"))
    table_file = tmp_path / "table.json"
    assert main(["eval", str(copy), "--checkpoints", "all", "--json", str(table_file)]) == 0
    fresh = {e["checkpoint"]: e for e in json.loads(table_file.read_text())["entries"]}
    assert sorted(fresh, key=lambda s: -1 if s is None else s) == [None, 1, 2, 3]
    for step, entry in by_step.items():
        other = fresh[step]
        assert entry["data"] == other["data"] and entry["weights_sha256"] == other["weights_sha256"]
        for name, value in other["metrics"].items():
            if value is None:
                assert entry["metrics"][name] is None, (step, name)
            else:
                assert entry["metrics"][name] == pytest.approx(value, rel=1e-5, abs=1e-6), (step, name)
    losses = {s: by_step[s]["metrics"]["loss"] for s in (1, 2, 3)}
    assert len({round(v, 6) for v in losses.values()}) == 3  # each checkpoint's own weights were scored

    # `hone eval --checkpoints all` on the run itself finds everything stored: nothing is scored again.
    again = tmp_path / "again.json"
    before = (run_dir / "scores.json").read_bytes()
    assert main(["eval", str(run_dir), "--checkpoints", "all", "--json", str(again)]) == 0
    assert json.loads(again.read_text())["reused"] == ["base", "step 1", "step 2", "step 3"]
    assert (run_dir / "scores.json").read_bytes() == before

    # `hone compare` names each run's best checkpoint by held-out loss, read from scores.json.
    best = min(losses, key=losses.get)
    compared = tmp_path / "compare.json"
    capsys.readouterr()
    monkeypatch.setenv("COLUMNS", "250")  # one line per row: the cells whole
    assert main(["compare", str(run_dir), str(copy), "--json", str(compared)]) == 0
    shown = capsys.readouterr().out
    for run in json.loads(compared.read_text())["runs"]:
        assert run["metrics"]["best_checkpoint"] == best, run["name"]
        assert run["metrics"]["best_checkpoint_loss"] == pytest.approx(losses[best], rel=1e-5)
    assert "best checkpoint" in shown and f"step {best} · loss {losses[best]:.4f}" in shown
