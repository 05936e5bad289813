"""What a resume may change, checked without a model: each setting's rule on resume, the data fingerprint, the
refusals and their messages, the learning-rate schedule re-aimed from the next step, the run's config history."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from hone.core.config import SECTIONS, RunConfig
from hone.core.errors import HoneError
from hone.core.train import data_hashes
from hone.core.train import resume_checks as rc


def _config(tmp_path: Path, *overrides: str) -> RunConfig:
    return RunConfig().with_overrides(
        [
            f"data.train=[{json.dumps(str(tmp_path / 'train.jsonl'))}]",
            'model.name_or_path="some/model"',
            "train.max_steps=10",
            "train.lr=1e-3",
            "train.warmup_steps=1",
            "data.max_length=64",
            "train.batch_tokens=256",
            *overrides,
        ]
    )


def _run_folder(tmp_path: Path, config: RunConfig, step: int = 4, **state) -> Path:
    """A run folder whose newest checkpoint is at `step`, recorded as the trainer records it."""
    (tmp_path / "train.jsonl").write_text('{"text": "a"}\n{"text": "b"}\n', encoding="utf-8")
    run = tmp_path / "run"
    folder = run / "checkpoints" / f"step-{step:06d}"
    folder.mkdir(parents=True)
    config.save(run / "config.toml")
    record = {
        "step": step,
        "position": step,
        "split": 1,
        "config": config.to_dict(),
        "data": rc.data_fingerprint(config.data),
        "epoch": 0,
        "total_steps": config.train.max_steps,
    }
    (folder / "state.json").write_text(json.dumps({**record, **state}), encoding="utf-8")
    return run


def _check(run: Path, config: RunConfig, **kwargs) -> rc.ResumeCheck:
    """check_resume against the run's one checkpoint (named, so the test does not depend on how checkpoints.py
    decides which checkpoints are complete)."""
    return rc.check_resume(run, config, checkpoint=next((run / "checkpoints").iterdir()), **kwargs)


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


# ---- each setting's rule ----


def test_every_setting_has_its_own_rule_on_resume():
    keys = [f"{name}.{f.name}" for name, cls in SECTIONS.items() for f in dataclasses.fields(cls)]
    missing = [k for k in keys if k not in rc.ON_RESUME]
    assert not missing, f"settings without a rule on resume (add them to resume_checks.ON_RESUME): {missing}"
    assert set(rc.ON_RESUME) == set(keys), "ON_RESUME names settings the config does not have"
    assert all(rule.kind in rc.KINDS and rule.why for rule in rc.ON_RESUME.values())
    kinds = {key: rc.ON_RESUME[key].kind for key in keys}
    for key in (
        "model.name_or_path",
        "lora.r",
        "lora.targets",
        "data.train",
        "data.max_length",
        "train.seed",
        "train.batch_tokens",
        "train.grad_accum",
        "train.optimizer",
        "speed.packing",
        "output.name",
    ):
        assert kinds[key] == "refused", key
    for key in ("train.lr", "train.max_steps", "train.epochs", "train.schedule", "train.warmup_steps"):
        assert kinds[key] == "schedule", key
    for key in ("output.checkpoint_every", "output.keep_checkpoints", "train.eval_every", "speed.attention"):
        assert kinds[key] == "safe", key


def test_a_change_that_moves_the_data_order_is_refused_naming_each_key(tmp_path):
    trained = _config(tmp_path)
    run = _run_folder(tmp_path, trained)
    before = _snapshot(run)
    wanted = trained.with_overrides(["train.batch_tokens=128", "lora.r=8", "output.checkpoint_every=2"])
    with pytest.raises(HoneError) as refused:
        _check(run, wanted)
    message, advice = refused.value.message, refused.value.advice
    assert "step 4" in message
    assert "train.batch_tokens 256 → 128" in message and "lora.r 16 → 8" in message
    assert "packed" in message and "adapter" in message  # each key says why
    assert "checkpoint_every" not in message  # a safe change is not part of the refusal
    assert "--set train.batch_tokens=128" in advice and "--set lora.r=8" in advice
    assert str(run / "config.toml") in advice
    assert _snapshot(run) == before  # a refused resume writes nothing


def test_safe_and_schedule_changes_are_applied_and_said(tmp_path):
    trained = _config(tmp_path)
    run = _run_folder(tmp_path, trained)
    check = _check(run, trained.with_overrides(["train.lr=1e-5", "output.checkpoint_every=2"]))
    assert check.step == 4
    assert [(c.key, c.rule.kind) for c in check.changes] == [
        ("train.lr", "schedule"),
        ("output.checkpoint_every", "safe"),
    ]
    said = [n for n in check.notices if n.topic == "resume"]
    assert any("output.checkpoint_every 0 → 2" in n.message and n.step == 5 for n in said)


def test_the_baseline_is_the_checkpoint_not_a_hand_edited_config_toml(tmp_path):
    trained = _config(tmp_path)
    run = _run_folder(tmp_path, trained)
    edited = trained.with_overrides(["train.seed=7"])
    edited.save(run / "config.toml")  # the user edited the run's config.toml after the checkpoint
    with pytest.raises(HoneError, match=r"train\.seed 0 → 7"):
        _check(run, RunConfig.load(run / "config.toml"))


def test_max_steps_below_the_checkpoint_is_refused(tmp_path):
    trained = _config(tmp_path)
    run = _run_folder(tmp_path, trained, step=6)
    with pytest.raises(HoneError, match=r"train\.max_steps = 5 .* step 6"):
        _check(run, trained.with_overrides(["train.max_steps=5"]))


def test_a_finished_run_resumed_at_the_same_length_is_refused_before_anything_is_written(tmp_path):
    trained = _config(tmp_path)
    run = _run_folder(tmp_path, trained, step=10)  # total_steps 10: the final checkpoint
    _check(run, trained)  # killed after its last checkpoint, before it finished: the resume saves the adapter
    (run / "run.json").write_text(
        json.dumps(
            {"run_dir": str(run), "name": "run", "model": "m", "status": "finished", "step": 10, "total_steps": 10}
        ),
        encoding="utf-8",
    )
    before = _snapshot(run)
    with pytest.raises(HoneError, match=r"has already finished: its newest checkpoint is step 10 of 10") as e:
        _check(run, trained)
    assert "--set train.max_steps=20" in e.value.advice and str(run / "adapter") in e.value.advice
    assert _snapshot(run) == before
    longer = _check(run, trained.with_overrides(["train.max_steps=15"]))  # a longer run goes on
    assert [c.key for c in longer.changes] == ["train.max_steps"]


def test_a_checkpoint_without_a_record_is_compared_with_config_toml_and_said_unverified(tmp_path):
    trained = _config(tmp_path)
    run = _run_folder(tmp_path, trained)
    state_file = run / "checkpoints" / "step-000004" / "state.json"
    state_file.write_text(json.dumps({"step": 4, "position": 4}), encoding="utf-8")  # written by an older Hone
    with pytest.raises(HoneError, match=r"train\.grad_accum 1 → 2"):
        _check(run, trained.with_overrides(["train.grad_accum=2"]))
    check = _check(run, trained)
    assert any(n.level == "warning" and "cannot be checked" in n.message for n in check.notices)


# ---- the data fingerprint ----


def test_file_digest_is_size_and_sha256_and_sees_a_same_size_edit(tmp_path):
    path = tmp_path / "rows.jsonl"
    data = os.urandom(3 * (1 << 20) + 17)  # more than one read chunk, not a multiple of it
    path.write_bytes(data)
    assert rc.file_digest(path) == (len(data), hashlib.sha256(data).hexdigest())
    stat = path.stat()
    edited = bytes([data[0] ^ 1]) + data[1:]
    path.write_bytes(edited)
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # same size, same mtime: only the bytes differ
    assert rc.file_digest(path) == (len(data), hashlib.sha256(edited).hexdigest())


def test_file_digest_reads_an_unchanged_file_once(tmp_path, monkeypatch):
    path = tmp_path / "rows.jsonl"
    path.write_bytes(b"x" * 1000)
    monkeypatch.setattr(data_hashes, "_RACY_NS", -1)  # just written: kept although its ctime is recent
    first = rc.file_digest(path)
    monkeypatch.setattr(data_hashes, "_sha256_of", lambda p: pytest.fail("an unchanged file was hashed again"))
    assert rc.file_digest(path) == first


def test_a_changed_training_file_is_refused_naming_it_and_the_ways_on(tmp_path):
    trained = _config(tmp_path)
    run = _run_folder(tmp_path, trained)
    train = tmp_path / "train.jsonl"
    old_hash = hashlib.sha256(train.read_bytes()).hexdigest()
    train.write_text('{"text": "a"}\n{"text": "c"}\n{"text": "d"}\n', encoding="utf-8")
    before = _snapshot(run)
    with pytest.raises(HoneError) as refused:
        _check(run, trained)
    message, advice = refused.value.message, refused.value.advice
    assert str(train) in message and "28 → 42 bytes" in message and old_hash[:12] in message
    assert "--data-changed restart-epoch" in advice and "--data-changed continue" in advice
    assert f"hone train {run / 'config.toml'}" in advice
    assert _snapshot(run) == before
    for mode in ("restart-epoch", "continue"):
        check = _check(run, trained, data_changed=mode)
        warned = [n.message for n in check.notices if n.level == "warning"]
        assert any(str(train) in m and mode in m for m in warned), warned


def test_a_changed_eval_file_is_a_warning(tmp_path):
    (tmp_path / "eval.jsonl").write_text('{"text": "e"}\n', encoding="utf-8")
    trained = _config(tmp_path, f"data.eval=[{json.dumps(str(tmp_path / 'eval.jsonl'))}]")
    run = _run_folder(tmp_path, trained)
    (tmp_path / "eval.jsonl").write_text('{"text": "f"}\n{"text": "g"}\n', encoding="utf-8")
    check = _check(run, trained)
    assert any("eval.jsonl" in n.message and "evaluation" in n.message and n.level == "warning" for n in check.notices)


# ---- the config history ----


def test_the_effective_config_is_written_and_the_old_one_kept(tmp_path):
    trained = _config(tmp_path)
    run = _run_folder(tmp_path, trained)
    wanted = trained.with_overrides(["train.lr=1e-5"])
    check = _check(run, wanted)
    assert rc.write_config(run, wanted, check) == run / "config.1.toml"
    assert RunConfig.load(run / "config.toml") == wanted
    assert RunConfig.load(run / "config.1.toml") == trained
    assert "train.lr 0.001 → 1e-05" in (run / "config.toml").read_text(encoding="utf-8").splitlines()[0]
    again = wanted.with_overrides(["train.lr=2e-5"])
    assert rc.write_config(run, again, _check(run, again)) == run / "config.2.toml"
    assert RunConfig.load(run / "config.2.toml") == wanted
    assert rc.write_config(run, again, _check(run, again)) is None  # nothing changed: nothing kept


# ---- the schedule and the data position ----


def _cosine(step: int, lr: float, warmup: int, total: int) -> float:
    """Reference: linear warmup, then cosine decay to 0, for 0-based optimizer step `step`."""
    if step < warmup:
        return lr * (step + 1) / warmup
    return lr * 0.5 * (1 + math.cos(math.pi * (step - warmup) / (total - warmup)))


def test_a_new_lr_and_length_take_effect_from_the_next_step(tmp_path):
    from hone.core.train.optim import build_scheduler

    trained = _config(tmp_path)  # lr 1e-3, one warmup step, 10 steps, cosine
    param = torch.nn.Parameter(torch.zeros(3))
    optimizer = torch.optim.AdamW([param], lr=trained.train.lr)
    scheduler = build_scheduler(optimizer, trained.train, 10)
    for _ in range(4):
        optimizer.step()
        scheduler.step()
    assert optimizer.param_groups[0]["lr"] == pytest.approx(_cosine(4, 1e-3, 1, 10))
    wanted = trained.with_overrides(["train.lr=1e-5", "train.max_steps=20"])
    said = rc.retarget_schedule(optimizer, scheduler, trained.train, wanted.train, 10, 20, step=4)
    assert said is not None and "train.lr 0.001 → 1e-05" in said and "steps in all 10 → 20" in said
    for step in range(4, 8):  # what the next steps run at: the new peak on the new length
        assert optimizer.param_groups[0]["lr"] == pytest.approx(_cosine(step, 1e-5, 1, 20), rel=1e-12)
        optimizer.step()
        scheduler.step()
    same = rc.retarget_schedule(optimizer, scheduler, wanted.train, wanted.train, 20, 20, step=8)
    assert same is None


def test_weight_decay_is_applied_to_the_restored_optimizer(tmp_path):
    trained = _config(tmp_path)
    param = torch.nn.Parameter(torch.zeros(3))
    optimizer = torch.optim.AdamW([param], lr=1e-3, weight_decay=0.0)
    said = rc.apply_update_settings(optimizer, trained.train, trained.with_overrides(["train.weight_decay=0.1"]).train)
    assert optimizer.param_groups[0]["weight_decay"] == 0.1 and "weight_decay" in said[0]


class _Stream:
    """A PackStream stand-in: `sizes[e]` packs in epoch e (the last size repeats)."""

    def __init__(self, sizes):
        self.sizes = sizes

    def plan(self, epoch):
        return [[0]] * self.sizes[min(epoch, len(self.sizes) - 1)]


def test_steps_in_all_from_a_position():
    config = RunConfig().with_overrides(["train.epochs=2", "train.grad_accum=2"])
    stream = _Stream([10, 12])  # 22 packs in two epochs
    assert rc.total_steps_from(config, stream, step=0, position=0) == 11
    assert rc.total_steps_from(config, stream, step=4, position=8) == 11  # where the run left it
    assert rc.total_steps_from(config, stream, step=4, position=0) == 15  # the data started over: 11 more steps
    assert rc.total_steps_from(config, stream, step=4, position=21) == 5  # one pack left: one more step
    assert rc.total_steps_from(config.with_overrides(["train.max_steps=30"]), stream, step=4, position=0) == 30


def test_restart_epoch_starts_at_the_first_pack_of_that_epoch():
    stream = _Stream([10, 12, 9])
    assert rc.epoch_start(stream, 0) == 0 and rc.epoch_start(stream, 1) == 10 and rc.epoch_start(stream, 2) == 22


def test_a_tokenization_change_under_unchanged_files_is_refused(tmp_path):
    trained = _config(tmp_path)
    lengths = np.array([50, 60, 70])
    run = _run_folder(tmp_path, trained, layout=rc.layout_of(lengths, trained, batch_tokens=256, tokenizer="t1"))
    check = _check(run, trained)
    with pytest.raises(HoneError, match="tokeniz"):
        check.check_layout(rc.layout_of(np.array([50, 61, 70]), trained, batch_tokens=256, tokenizer="t2"))
    check.check_layout(rc.layout_of(lengths, trained, batch_tokens=256, tokenizer="t1"))  # the same: passes


def test_a_resume_packs_rows_as_the_run_did_whatever_the_memory_fit_picks(tmp_path):
    trained = _config(tmp_path)
    run = _run_folder(tmp_path, trained, layout=rc.layout_of(np.array([50]), trained, batch_tokens=192, tokenizer="t"))
    check = _check(run, trained)
    fitted = trained.with_overrides(["train.batch_tokens=128", 'speed.checkpoint="offload"'])
    kept, notices = check.keep_pack_order(fitted)
    assert kept.train.batch_tokens == 192 and kept.speed.checkpoint == "offload"
    assert "192" in notices[0].message and "128" in notices[0].message
