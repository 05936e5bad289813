"""Checkpoints on disk: complete only when the manifest verifies, a same-step save never leaves a moment without the
step, training state read with torch.load(weights_only=True) so a crafted file cannot run code. Real files, a small
real model and optimizer; tests/reliability kills real runs at every file-system change."""

from __future__ import annotations

import json
import random
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch

from hone.core.errors import HoneError
from hone.core.train.checkpoints import (
    checkpoint_report,
    complete_checkpoints,
    latest_checkpoint,
    load_checkpoint,
    resumable_checkpoint,
    save_checkpoint,
)


def _training(seed: int = 0):
    """A small model after one AdamW step (so the optimizer has moments) and its LambdaLR schedule."""
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Linear(16, 4))
    model[0].weight.requires_grad_(False)  # a frozen tensor stays out of the checkpoint
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 / (step + 1))
    model(torch.randn(3, 8)).square().sum().backward()
    optimizer.step()
    scheduler.step()
    return model, optimizer, scheduler


def _save(run_dir, step, keep=2, seed=0):
    model, optimizer, scheduler = _training(seed)
    return save_checkpoint(run_dir, step, model, optimizer, scheduler, {"position": step * 2}, keep=keep)


def _names(run_dir) -> list[str]:
    return sorted(p.name for p in (run_dir / "checkpoints").iterdir())


def test_a_checkpoint_counts_only_when_every_file_matches_its_manifest(tmp_path):
    good = _save(tmp_path, 4)
    assert set(json.loads((good / "manifest.json").read_text())["files"]) == {
        "trainable.safetensors",
        "training_state.pt",
        "state.json",
    }
    # What a kill inside the old same-step rewrite left: step-N with state.json but no weights, counted complete.
    killed = tmp_path / "checkpoints" / "step-000008"
    shutil.copytree(good, killed)
    (killed / "trainable.safetensors").unlink()
    assert latest_checkpoint(tmp_path) == good
    path, skipped = resumable_checkpoint(tmp_path)
    assert path == good
    assert skipped == [
        "checkpoint step-000008 is incomplete (trainable.safetensors is missing); resuming from step 4 instead"
    ]

    shutil.rmtree(killed)
    shutil.copytree(good, killed)
    state = killed / "training_state.pt"
    size = state.stat().st_size
    state.write_bytes(state.read_bytes()[:-1])
    assert checkpoint_report(tmp_path)[1] == {
        8: f"damaged (training_state.pt is {size - 1:,} bytes, the manifest says {size})"
    }

    shutil.rmtree(killed)
    shutil.copytree(good, killed)
    weights = bytearray((killed / "trainable.safetensors").read_bytes())
    weights[-1] ^= 0x01  # one bit of one weight: same size, other content
    (killed / "trainable.safetensors").write_bytes(bytes(weights))
    assert checkpoint_report(tmp_path)[1] == {
        8: "damaged (trainable.safetensors does not match its sha256 in the manifest)"
    }
    assert latest_checkpoint(tmp_path) == good

    manifest = (killed / "manifest.json").read_bytes()
    (killed / "manifest.json").write_bytes(manifest[: len(manifest) // 2])
    assert checkpoint_report(tmp_path)[1] == {8: "damaged (manifest.json cannot be read)"}


def test_a_run_whose_only_checkpoints_are_broken_is_not_restarted_silently(tmp_path):
    good = _save(tmp_path, 4)
    (good / "trainable.safetensors").unlink()
    with pytest.raises(HoneError) as e:
        resumable_checkpoint(tmp_path)
    assert "step-000004 is incomplete (trainable.safetensors is missing)" in e.value.message
    assert str(tmp_path / "checkpoints") in e.value.advice
    shutil.rmtree(tmp_path / "checkpoints")
    assert resumable_checkpoint(tmp_path) == (None, [])  # nothing saved yet: start from step 0


def test_a_same_step_save_replaces_the_step_and_a_kill_between_its_renames_keeps_the_old_one(tmp_path):
    first = _save(tmp_path, 4, seed=0)
    old_weights = (first / "trainable.safetensors").read_bytes()
    second = _save(tmp_path, 4, seed=1)  # the same step again (a stop right after a save, a finished run resumed)
    assert second == first and _names(tmp_path) == ["step-000004"]
    new_weights = (second / "trainable.safetensors").read_bytes()
    assert new_weights != old_weights and not checkpoint_report(tmp_path)[1]

    # The moment between the two renames of a same-step save: the old folder set aside, the new one not in yet.
    root = tmp_path / "checkpoints"
    shutil.copytree(second, root / ".tmp-step-000004")
    second.rename(root / ".old-step-000004")
    assert latest_checkpoint(tmp_path) == root / ".old-step-000004"
    model, optimizer, scheduler = _training(seed=2)
    assert load_checkpoint(root / ".old-step-000004", model, optimizer, scheduler)["step"] == 4
    assert torch.equal(model[1].weight, _training(seed=1)[0][1].weight)

    _save(tmp_path, 6, keep=1, seed=3)  # the next save puts the aside back, then prunes it as the older one
    assert _names(tmp_path) == ["step-000006"]


def test_leftovers_of_killed_saves_and_prunes_are_cleared_and_pruning_keeps_the_newest(tmp_path):
    _save(tmp_path, 2)
    root = tmp_path / "checkpoints"
    (root / ".tmp-step-000004").mkdir()  # killed while writing
    (root / ".tmp-step-000004" / "trainable.safetensors").write_bytes(b"half")
    (root / ".del-step-000001").mkdir()  # killed while deleting
    _save(tmp_path, 4)
    _save(tmp_path, 6)
    assert _names(tmp_path) == ["step-000004", "step-000006"]
    assert [p.name for p in complete_checkpoints(tmp_path)] == ["step-000004", "step-000006"]


def test_training_state_loads_with_weights_only_and_brings_back_every_rng(tmp_path):
    model, optimizer, scheduler = _training()
    random.seed(1)
    np.random.seed(2)
    torch.manual_seed(3)
    path = save_checkpoint(tmp_path, 1, model, optimizer, scheduler, {"position": 0})
    after_save = (random.random(), np.random.rand(3).tolist(), torch.rand(3).tolist())
    saved = torch.load(path / "training_state.pt", weights_only=True)  # nothing but tensors and plain values
    assert saved["optimizer"]["state"][1]["exp_avg"].shape == (4, 16)

    random.seed(9)
    np.random.seed(9)
    torch.manual_seed(9)
    fresh_model, fresh_optimizer, fresh_scheduler = _training(seed=5)
    state = load_checkpoint(path, fresh_model, fresh_optimizer, fresh_scheduler)
    assert state == {"position": 0, "step": 1}
    assert (random.random(), np.random.rand(3).tolist(), torch.rand(3).tolist()) == after_save
    assert torch.equal(fresh_model[1].weight, model[1].weight)
    assert torch.equal(
        fresh_optimizer.state_dict()["state"][1]["exp_avg_sq"], optimizer.state_dict()["state"][1]["exp_avg_sq"]
    )
    assert fresh_scheduler.last_epoch == scheduler.last_epoch == 1


class Payload:
    """Pickled, it calls exec on load: what a crafted training_state.pt in a shared run folder would do."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return exec, (f"open({self.marker!r}, 'w').write('ran')",)


def _plant(checkpoint, marker) -> None:
    """Put the payload in the checkpoint's training_state.pt, and its size and hash in the manifest (so the manifest
    verifies: what refuses it must be the loader)."""
    import hashlib

    path = checkpoint / "training_state.pt"
    torch.save({"optimizer": Payload(marker), "scheduler": {}, "scaler": None, "rng": {}}, path)
    manifest = json.loads((checkpoint / "manifest.json").read_text())
    data = path.read_bytes()
    manifest["files"]["training_state.pt"] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    (checkpoint / "manifest.json").write_text(json.dumps(manifest))


def test_a_pickle_payload_in_training_state_is_refused_and_never_runs(tmp_path):
    checkpoint = _save(tmp_path, 4)
    marker = tmp_path / "payload-ran"
    _plant(checkpoint, marker)
    # The payload is live: a loader that unpickles anything (the old one did) runs it, in another process.
    shutil.copy(checkpoint / "training_state.pt", tmp_path / "probe.pt")
    code = f"import torch; torch.load({str(tmp_path / 'probe.pt')!r}, weights_only=False)"
    subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=300)
    assert marker.read_text() == "ran"
    marker.unlink()

    assert latest_checkpoint(tmp_path) == checkpoint  # the manifest verifies
    model, optimizer, scheduler = _training()
    with pytest.raises(HoneError) as e:
        load_checkpoint(checkpoint, model, optimizer, scheduler)
    assert str(checkpoint / "training_state.pt") in e.value.message and "could run code" in e.value.message
    assert not marker.exists()


def test_a_checkpoint_from_before_manifests_is_named_and_not_resumed(tmp_path):
    folder = tmp_path / "checkpoints" / "step-000010"
    folder.mkdir(parents=True)
    _, optimizer, scheduler = _training()
    torch.save(
        {
            "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict(),
            "scaler": None,
            "rng": {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()},
        },
        folder / "training_state.pt",
    )  # the old format: numpy's state as an ndarray, a full pickle
    (folder / "state.json").write_text(json.dumps({"step": 10, "position": 20}))
    with pytest.raises(HoneError) as e:
        resumable_checkpoint(tmp_path)
    assert (
        "step-000010 is written by an earlier Hone without manifest.json: it cannot be resumed safely"
        in e.value.message
    )
