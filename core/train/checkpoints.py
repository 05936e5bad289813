"""Resumable checkpoints, written atomically: a kill at any moment leaves either the old set or the new one.

    checkpoints/step-000050/trainable.safetensors   every trainable tensor (LoRA weights, anything unfrozen)
                            training_state.pt        optimizer, scheduler, grad scaler, RNG states
                            state.json               step and data position; written last, so its presence
                                                     marks a complete checkpoint

The folder is written under a temporary name, flushed to disk, then renamed into place.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from hone.core.train.run_dir import CHECKPOINTS_DIR

STATE_FILE = "state.json"


def _fsync_dir(path: Path) -> None:
    if os.name == "posix":
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _fsync_file(path: Path) -> None:
    with open(path, "rb+") as f:
        os.fsync(f.fileno())


def rng_state() -> dict:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def trainable_state(model) -> dict[str, torch.Tensor]:
    # A copy of each (not `.cpu()`, which returns CPU parameters themselves: views of one optimizer buffer would then
    # share storage, which safetensors refuses).
    return {name: p.detach().to("cpu", copy=True).contiguous() for name, p in model.named_parameters()
            if p.requires_grad}


def save_checkpoint(run_dir: Path, step: int, model, optimizer, scheduler, state: dict, *, scaler=None,
                    keep: int = 2) -> Path:
    """Write checkpoints/step-{step:06d} atomically and prune to the `keep` newest. Returns its path."""
    root = Path(run_dir) / CHECKPOINTS_DIR
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step-{step:06d}"
    tmp = root / f".tmp-step-{step:06d}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    save_file(trainable_state(model), tmp / "trainable.safetensors")
    torch.save({"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
                "scaler": scaler.state_dict() if scaler is not None else None, "rng": rng_state()},
               tmp / "training_state.pt")
    (tmp / STATE_FILE).write_text(json.dumps(dict(state, step=step), indent=2), encoding="utf-8")
    for f in tmp.iterdir():
        _fsync_file(f)
    _fsync_dir(tmp)
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    _fsync_dir(root)
    for old in complete_checkpoints(run_dir)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def complete_checkpoints(run_dir: Path) -> list[Path]:
    """Complete checkpoints of a run, oldest first (half-written temporary folders are ignored)."""
    root = Path(run_dir) / CHECKPOINTS_DIR
    if not root.is_dir():
        return []
    done = [d for d in root.iterdir() if d.name.startswith("step-") and (d / STATE_FILE).is_file()]
    return sorted(done, key=lambda d: int(d.name.split("-")[1]))


def latest_checkpoint(run_dir: Path) -> Path | None:
    done = complete_checkpoints(run_dir)
    return done[-1] if done else None


def load_checkpoint(path: Path, model, optimizer, scheduler, *, scaler=None) -> dict:
    """Restore model weights, optimizer, scheduler, scaler and RNG from `path`; returns its state.json."""
    weights = load_file(Path(path) / "trainable.safetensors")
    params = dict(model.named_parameters())
    missing = set(weights) - set(params)
    if missing:
        raise RuntimeError(f"checkpoint {path} has tensors this model lacks: {sorted(missing)[:3]}")
    with torch.no_grad():
        for name, tensor in weights.items():
            params[name].copy_(tensor.to(params[name].device))
    training = torch.load(Path(path) / "training_state.pt", map_location="cpu", weights_only=False)
    optimizer.load_state_dict(training["optimizer"])
    scheduler.load_state_dict(training["scheduler"])
    if scaler is not None and training.get("scaler") is not None:
        scaler.load_state_dict(training["scaler"])
    set_rng_state(training["rng"])
    return json.loads((Path(path) / STATE_FILE).read_text(encoding="utf-8"))
