"""Every checkpoint of a real run scored, stored, reused, the best picked and exported (`hone eval --checkpoints`,
`hone export --checkpoint`): a tiny random-init model trained 3 CPU steps with a checkpoint and an evaluation at each.

References come from elsewhere: the trainer's own evaluation loss at each step, `hone eval`'s answers of the final
adapter (the same weights as the last checkpoint), plain transformers for the base's loss, the checkpoint files'
tensors for the export.
"""

from __future__ import annotations

import hashlib
import json
import math
import shutil
from pathlib import Path

import pytest

STEPS = 3


@pytest.fixture(scope="module")
def trained(tiny_model_dir, chat_files, tmp_path_factory):
    """(run folder, {step: the trainer's eval loss}) of a finished run with a checkpoint at each of its 3 steps."""
    from hone.core import events
    from hone.core.config import RunConfig
    from hone.core.train.trainer import Trainer

    train, eval_file = chat_files
    runs = tmp_path_factory.mktemp("runs")
    config = RunConfig().with_overrides(
        [
            f"model.name_or_path={json.dumps(str(tiny_model_dir('tiny-dense')))}",
            f"data.train=[{json.dumps(str(train))}]",
            f"data.eval=[{json.dumps(str(eval_file))}]",
            f"output.runs_dir={json.dumps(str(runs))}",
            "output.name=r",
            "output.checkpoint_every=1",
            f"output.keep_checkpoints={STEPS}",
            "data.max_length=256",
            "train.batch_tokens=256",
            f"train.max_steps={STEPS}",
            "train.eval_every=1",
            "train.lr=2e-2",
            "train.warmup_steps=1",
        ]
    )
    seen = list(Trainer(config, device="cpu").run())
    assert isinstance(seen[-1], events.RunFinished), seen[-1]
    eval_loss = {e.step: e.loss for e in seen if isinstance(e, events.EvalMetrics)}
    assert sorted(eval_loss) == [1, 2, 3]
    return runs / "r", eval_loss


@pytest.fixture(scope="module")
def scored(trained, tmp_path_factory):
    """`hone eval RUN --checkpoints all --json OUT` run once: (run folder, the JSON table, the eval's stderr)."""
    from hone.core.cli import main

    run_dir, _ = trained
    out = tmp_path_factory.mktemp("table") / "table.json"
    assert main(["eval", str(run_dir), "--checkpoints", "all", "--rows", "0", "--json", str(out)]) == 0
    return run_dir, json.loads(out.read_text())


def _copy_run(run_dir: Path, tmp_path: Path) -> Path:
    copy = tmp_path / run_dir.name
    shutil.copytree(run_dir, copy, ignore=shutil.ignore_patterns("exports", "run.lock"))
    return copy


def _eval_file(run_dir: Path) -> Path:
    from hone.core.config import RunConfig

    return Path(RunConfig.load(run_dir / "config.toml").data.eval[0])


def test_answer_metrics_by_hand():
    from hone.core.inference.answer_scores import answer_metrics, contains, normalized_match

    assert normalized_match("  The Answer: 42!", "the answer 42")
    assert contains("I think Paris, France.", "paris") and not contains("Parisian", "paris")
    answers = ['{"a": 1}', "Paris is it", "no", "{broken"]
    references = ['{"a": 1}', "Paris", "No.", '["x"]']
    got = answer_metrics(answers, references)
    # exact: row 1; normalized: rows 1 and 3; contains: rows 1, 2, 3 (row 4's reference normalizes to "x").
    # word F1: 1, 2*(1/3*1)/(1/3+1) = 0.5, 1, 0 ('broken' vs 'x'). JSON: 1 valid of the 2 JSON references.
    assert got == pytest.approx(
        {"exact": 0.25, "normalized": 0.5, "contains": 0.75, "f1": (1 + 0.5 + 1 + 0) / 4, "json_valid": 0.5}
    )
    assert answer_metrics(["x"], ["plain text"])["json_valid"] is None


def test_every_checkpoint_scored_against_the_trainers_own_eval_loss(trained, scored):
    run_dir, eval_loss = trained
    _, table = scored
    data = _eval_file(run_dir)
    stored = json.loads((run_dir / "scores.json").read_text())
    entries = {e["checkpoint"]: e for e in stored["entries"]}
    assert sorted(entries, key=lambda s: -1 if s is None else s) == [None, 1, 2, 3]
    for entry in entries.values():
        assert entry["data"] == {
            "path": str(data.resolve()),
            "sha256": hashlib.sha256(data.read_bytes()).hexdigest(),
            "rows": 4,
        }
        assert entry["metrics"]["perplexity"] == pytest.approx(math.exp(entry["metrics"]["loss"]), rel=1e-9)
    for step in (1, 2, 3):  # the trainer evaluated each step's weights on the same file
        assert entries[step]["metrics"]["loss"] == pytest.approx(eval_loss[step], rel=1e-5)
    losses = {s: entries[s]["metrics"]["loss"] for s in (1, 2, 3)}
    assert len({round(v, 6) for v in losses.values()}) == 3  # each checkpoint's own weights were scored
    assert table["best"] == min(losses, key=losses.get) and table["by"] == "loss"
    assert [e["checkpoint"] for e in table["entries"]] == [None, 1, 2, 3] and table["reused"] == []


def test_base_loss_is_plain_transformers_on_the_same_tokens(trained, scored):
    import torch
    import torch.nn.functional as F
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from hone.core.config import RunConfig
    from hone.core.data.labels import RowEncoder
    from hone.core.data.rows import Row
    from hone.core.inference.prompts import read_prompts

    run_dir, _ = trained
    config = RunConfig.load(run_dir / "config.toml")
    tokenizer = AutoTokenizer.from_pretrained(run_dir / "adapter")
    model = AutoModelForCausalLM.from_pretrained(config.model.name_or_path, dtype=torch.float32).eval()
    prompts, _ = read_prompts(_eval_file(run_dir))
    encoder = RowEncoder(tokenizer, max_length=config.data.max_length)
    total, count = 0.0, 0
    for p in prompts:
        (enc,) = encoder.encode([Row("x", messages=[*p.messages, {"role": "assistant", "content": p.reference}])])
        ids = torch.as_tensor(enc.ids, dtype=torch.long)
        with torch.no_grad():
            logits = model(input_ids=ids[None]).logits[0]
        targets = torch.where(torch.as_tensor(enc.trained), ids, -100)[1:]
        total += float(F.cross_entropy(logits[:-1], targets, ignore_index=-100, reduction="sum"))
        count += int((targets != -100).sum())
    stored = json.loads((run_dir / "scores.json").read_text())
    (base,) = [e for e in stored["entries"] if e["checkpoint"] is None]
    assert base["metrics"]["loss"] == pytest.approx(total / count, rel=1e-5)


def test_answers_scored_are_the_final_adapters_answers(trained, scored, tmp_path):
    """The last checkpoint holds the final adapter's weights: its answer scores are those of `hone eval --out`'s
    fine-tuned answers (another loading path), and the base's those of its base answers."""
    from hone.core.cli import main
    from hone.core.inference.answer_scores import answer_metrics

    run_dir, _ = trained
    out = tmp_path / "answers.jsonl"
    assert main(["eval", str(run_dir), "--rows", "0", "--out", str(out)]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    stored = {e["checkpoint"]: e["metrics"] for e in json.loads((run_dir / "scores.json").read_text())["entries"]}
    references = [r["reference"] for r in rows]
    for step, side in ((STEPS, "tuned"), (None, "base")):
        expected = answer_metrics([r[side] for r in rows], references)
        assert {k: stored[step][k] for k in expected} == pytest.approx(expected)


def test_stored_scores_are_reused_not_rescored(scored, monkeypatch, capsys, tmp_path):
    from hone.core.cli import main
    from hone.core.inference import checkpoint_scoring

    run_dir, _ = scored
    before = (run_dir / "scores.json").read_bytes()

    def no_model(*args, **kwargs):
        raise AssertionError("a model was loaded although every score was stored")

    monkeypatch.setattr(checkpoint_scoring, "CheckpointModel", no_model)
    out = tmp_path / "again.json"
    assert main(["eval", str(run_dir), "--checkpoints", "2,3", "--rows", "0", "--json", str(out)]) == 0
    err = capsys.readouterr().err
    assert "reused the stored scores of base, step 2, step 3" in err and "not scored again" in err
    assert (run_dir / "scores.json").read_bytes() == before
    table = json.loads(out.read_text())
    assert [e["checkpoint"] for e in table["entries"]] == [None, 2, 3]
    assert sorted(table["reused"]) == ["base", "step 2", "step 3"]


def test_best_by_a_metric(scored, tmp_path):
    from hone.core.api import best_stored, read_scores
    from hone.core.cli import main

    run_dir, _ = scored
    entries = [e for e in read_scores(run_dir).entries if e.checkpoint is not None]
    by_loss = min(entries, key=lambda e: (e.metrics["loss"], e.checkpoint))
    by_f1 = min(entries, key=lambda e: (-e.metrics["f1"], e.checkpoint))  # highest; the earliest step on a tie
    assert best_stored(run_dir).checkpoint == by_loss.checkpoint
    assert best_stored(run_dir, "f1").checkpoint == by_f1.checkpoint
    out = tmp_path / "best.json"
    assert main(["eval", str(run_dir), "--checkpoints", "best", "--by", "f1", "--rows", "0", "--json", str(out)]) == 0
    table = json.loads(out.read_text())
    assert table["best"] == by_f1.checkpoint and table["by"] == "f1"
    assert [e["checkpoint"] for e in table["entries"]] == [None, by_f1.checkpoint]


def test_reading_scores_needs_no_torch(scored):
    import subprocess
    import sys

    run_dir, _ = scored
    code = (
        "import sys; from hone.core.api import read_scores, best_stored; "
        f"s = read_scores({str(run_dir)!r}); b = best_stored({str(run_dir)!r}); "
        "print(len(s.entries), b.checkpoint, 'torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out[0] == "4" and out[2] == "False"


def test_a_step_without_checkpoint_names_the_steps_there_are(scored, capsys):
    from hone.core.cli import main

    run_dir, _ = scored
    assert main(["eval", str(run_dir), "--checkpoints", "2,7"]) == 2
    err = capsys.readouterr().err
    assert "no checkpoint of step 7" in err and "1, 2, 3" in err
    assert main(["export", str(run_dir), "--checkpoint", "7"]) == 2
    err = capsys.readouterr().err
    assert "no checkpoint of step 7" in err and "1, 2, 3" in err
    assert main(["eval", str(run_dir), "--checkpoints", "two"]) == 2
    assert "'two' is not a step" in capsys.readouterr().err


def test_damaged_scores_json_is_reported_and_rescored(scored, tmp_path, capsys):
    from hone.core.api import read_scores
    from hone.core.cli import main

    run_dir = _copy_run(scored[0], tmp_path)
    path = run_dir / "scores.json"
    good = json.loads(path.read_text())
    wrong = json.loads(json.dumps(good))
    wrong["entries"][1]["metrics"]["loss"] = "low"
    wrong["entries"][2]["data"] = ["not", "an", "object"]
    path.write_text(json.dumps(wrong))
    stored = read_scores(run_dir)
    assert "entries[1].metrics.loss is 'low', not a number" in stored.damage
    assert "entries[2].data is" in stored.damage and len(stored.entries) == 2

    path.write_bytes(b'{"hone_scores": 1, "entries": [{"checkpoint": 1,')  # cut short
    assert read_scores(run_dir).entries == [] and "is not valid JSON" in read_scores(run_dir).damage
    assert main(["eval", str(run_dir), "--checkpoints", "3", "--rows", "0"]) == 0
    err = capsys.readouterr().err
    assert "scores.json is not valid JSON" in err and "scored again" in err
    again = read_scores(run_dir)
    assert again.damage == "" and sorted(e.checkpoint or 0 for e in again.entries) == [0, 3]
    (step3,) = [e for e in again.entries if e.checkpoint == 3]
    (stored3,) = [e for e in good["entries"] if e["checkpoint"] == 3]
    assert step3.metrics["loss"] == pytest.approx(stored3["metrics"]["loss"], rel=1e-9)


def test_export_best_checkpoint_writes_its_adapter_and_names_it(scored, tmp_path, capsys):
    import torch
    from safetensors.torch import load_file

    from hone.core.api import best_stored
    from hone.core.cli import main

    run_dir = _copy_run(scored[0], tmp_path)
    best = best_stored(run_dir)
    assert main(["export", str(run_dir), "--checkpoint", "best"]) == 0
    assert f"best checkpoint by loss: step {best.checkpoint}" in capsys.readouterr().err
    out = run_dir / "exports" / f"adapter-step-{best.checkpoint}"
    exported = load_file(out / "adapter_model.safetensors")
    saved = load_file(run_dir / "checkpoints" / f"step-{best.checkpoint:06d}" / "trainable.safetensors")
    final = load_file(run_dir / "adapter" / "adapter_model.safetensors")
    assert len(exported) == len(saved) > 0
    for name, tensor in exported.items():  # peft saves "…lora_A.weight" for the model's "…lora_A.default.weight"
        assert torch.equal(tensor, saved[name.replace(".weight", ".default.weight")]), name
    assert best.checkpoint == STEPS or any(not torch.equal(exported[n], final[n]) for n in final)
    card = (out / "README.md").read_text()
    assert f"checkpoint at training step {best.checkpoint}" in card
    assert f"| held-out loss | {best.metrics['loss']:.4f} |" in card
    assert best.data.path in card and best.data.sha256 in card
    manifest = json.loads((out / "export.json").read_text())
    assert manifest["run"] == str(run_dir.resolve()) and manifest["adapter_step"] == best.checkpoint
    assert manifest["checkpoint"]["step"] == best.checkpoint
    assert manifest["checkpoint"]["scores"]["metrics"]["loss"] == best.metrics["loss"]
    assert not [p for p in run_dir.iterdir() if p.name.startswith(".checkpoint-export-")]


def test_export_a_step_that_differs_from_the_final_adapter(scored, tmp_path):
    """Step 1's weights, not the final ones, end up in the export (the card says so, with its stored scores)."""
    import torch
    from safetensors.torch import load_file

    from hone.core.cli import main

    run_dir = _copy_run(scored[0], tmp_path)
    out = tmp_path / "step1"
    assert main(["export", str(run_dir), "--checkpoint", "1", "--out", str(out)]) == 0
    exported = load_file(out / "adapter_model.safetensors")
    final = load_file(run_dir / "adapter" / "adapter_model.safetensors")
    saved = load_file(run_dir / "checkpoints" / "step-000001" / "trainable.safetensors")
    assert all(torch.equal(t, saved[n.replace(".weight", ".default.weight")]) for n, t in exported.items())
    assert any(not torch.equal(exported[n], final[n]) for n in final)
    assert "checkpoint at training step 1" in (out / "README.md").read_text()


def test_a_checkpoints_adapter_is_rebuilt_without_reading_the_base_weights(scored, tmp_path, monkeypatch):
    """The adapter of a checkpoint needs the model's structure, not its weights: a base of many GiB is never loaded
    (the model is built on the meta device), and the adapter is the checkpoint's tensors, loadable by peft."""
    import torch
    from peft import PeftModel
    from safetensors.torch import load_file

    import hone.core.models.load as load
    from hone.core.config import RunConfig
    from hone.core.export.dispatch import write_checkpoint_adapter

    run_dir = _copy_run(scored[0], tmp_path)
    config = RunConfig.load(run_dir / "config.toml")
    real_load = load.load_model
    base = real_load(config.model, device="cpu", for_training=False).model  # the reference, before the patch

    def no_weights(*args, **kwargs):
        raise AssertionError("the checkpoint's adapter was rebuilt by loading the base model's weights")

    monkeypatch.setattr(load, "load_model", no_weights)
    target = write_checkpoint_adapter(config, run_dir / "checkpoints" / "step-000001", 1, tmp_path / "adapter")
    saved = load_file(run_dir / "checkpoints" / "step-000001" / "trainable.safetensors")
    exported = load_file(target / "adapter_model.safetensors")
    assert len(exported) == len(saved) > 0
    for name, tensor in exported.items():
        assert not tensor.is_meta and torch.equal(tensor, saved[name.replace(".weight", ".default.weight")]), name
    tuned = PeftModel.from_pretrained(base, target)  # a real base takes the adapter as it would any other
    params = dict(tuned.named_parameters())
    for name, tensor in saved.items():
        assert torch.equal(params[name], tensor.to(params[name].dtype)), name


def test_export_best_without_scores_says_to_score_first(scored, tmp_path, capsys):
    from hone.core.cli import main

    run_dir = _copy_run(scored[0], tmp_path)
    (run_dir / "scores.json").unlink()
    assert main(["export", str(run_dir), "--checkpoint", "best"]) == 2
    err = capsys.readouterr().err
    assert "has no stored scores" in err and f"hone eval {run_dir} --checkpoints all" in err
    (run_dir / "scores.json").write_text("[1, 2]")
    assert main(["export", str(run_dir), "--checkpoint", "best", "--by", "f1"]) == 2
    err = capsys.readouterr().err
    assert "scores.json holds a JSON array, not an object" in err and "--checkpoints all" in err
    assert not (run_dir / "exports").exists()


def test_a_run_without_its_final_adapter_exports_a_checkpoint(scored, tmp_path, capsys):
    """A run stopped before its end has checkpoints but no adapter/: the checkpoint's adapter is rebuilt with the
    base's tokenizer and the run's template setting, as the trainer had it, and passes the export's checks."""
    import torch
    from safetensors.torch import load_file

    from hone.core.cli import main

    run_dir = _copy_run(scored[0], tmp_path)
    shutil.rmtree(run_dir / "adapter")
    assert main(["export", str(run_dir), "--checkpoint", "best", "--by", "bogus"]) == 2
    assert "there is no metric 'bogus'" in capsys.readouterr().err
    assert main(["export", str(run_dir), "--checkpoint", "2"]) == 0
    out = run_dir / "exports" / "adapter-step-2"
    saved = load_file(run_dir / "checkpoints" / "step-000002" / "trainable.safetensors")
    exported = load_file(out / "adapter_model.safetensors")
    assert all(torch.equal(t, saved[n.replace(".weight", ".default.weight")]) for n, t in exported.items())
    assert json.loads((out / "export.json").read_text())["passed"] is True
