"""Resumable checkpoints: at every instant a run folder holds its newest checkpoint, complete.

    checkpoints/step-000050/trainable.safetensors   every trainable tensor (LoRA weights, anything unfrozen)
                            training_state.pt        optimizer, scheduler, grad scaler, RNG states: tensors and
                                                     plain values only, read with torch.load(weights_only=True)
                            state.json               step, data position, micro-batch split
                            manifest.json            size and sha256 of each file above; written last: a
                                                     checkpoint is complete only when its manifest verifies

A save writes `.tmp-step-N/`, flushes it to disk and renames it to `step-N/`. Saving a step that exists already (a
stop right after a periodic save, resuming a finished run) renames the old folder aside to `.old-step-N/` first,
then renames the new one in, then deletes the aside: a kill between the two renames leaves the aside, which
`checkpoint_report` reads as step N and the next save puts back or deletes. Pruning renames a folder to
`.del-step-N/` before deleting it, so a kill never leaves a half-deleted `step-N/`.

Checkpoints written before manifests are not resumed: their training_state.pt is a full Python pickle (numpy's RNG
state was an ndarray), and loading one can run any code put in it. `resumable_checkpoint` names them and says so.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import pickle
import random
import re
import shutil
import signal
from pathlib import Path

import numpy as np
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file
from safetensors.torch import save as save_tensors

from hone.core.control import env_int
from hone.core.errors import HoneError
from hone.core.events import quoted
from hone.core.train import json_checks
from hone.core.train.run_dir import CHECKPOINTS_DIR, disk_full_error, is_disk_full

WEIGHTS_FILE = "trainable.safetensors"
TRAINING_STATE_FILE = "training_state.pt"
STATE_FILE = "state.json"
MANIFEST_FILE = "manifest.json"
_PAYLOAD_FILES = (WEIGHTS_FILE, TRAINING_STATE_FILE, STATE_FILE)
_FORMAT = 2  # manifest.json's "hone_checkpoint": 1 was the pickle format without a manifest
FAULT_ENV = "HONE_FAULT_AT"  # the test hook's variable (`_fault_point`); internal
_TMP, _OLD, _DEL = ".tmp-", ".old-", ".del-"  # prefixes of a folder being written, set aside, being deleted


def _fault_point() -> None:
    """Test hook for tests/reliability: with HONE_FAULT_AT=k in the environment, the process kills itself (SIGKILL,
    no cleanup) just before the k-th file-system change of checkpoint saving, counted over the process. Changes are
    mkdir, each file written, each rename and each tree removal (fsyncs change nothing a kill could observe). Unset,
    this is one dictionary lookup per change."""
    at = env_int(FAULT_ENV, minimum=1)  # a stray value is a HoneError naming it, never a kill at a wrong place
    if at is None:
        return
    _fault_point.count = getattr(_fault_point, "count", 0) + 1
    if _fault_point.count == at:
        os.kill(os.getpid(), getattr(signal, "SIGKILL", signal.SIGTERM))


def _fsync_dir(path: Path) -> None:
    if os.name == "posix":
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


# ---- RNG states as tensors and plain values ----
def rng_state() -> dict:
    """Every RNG's state, in types torch.load(weights_only=True) reads: python's (version, 625 ints, gauss), numpy's
    MT19937 keys as an int64 tensor (624,) beside its position and cached gaussian, torch's as uint8 tensors."""
    version, keys, gauss = random.getstate()
    kind, np_keys, pos, has_gauss, cached = np.random.get_state()
    state = {
        "python": [version, list(keys), gauss],
        "numpy": [kind, torch.from_numpy(np_keys.astype(np.int64)), int(pos), int(has_gauss), float(cached)],
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    version, keys, gauss = state["python"]
    random.setstate((version, tuple(keys), gauss))
    kind, np_keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, np_keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def trainable_state(model) -> dict[str, torch.Tensor]:
    # A copy of each (not `.cpu()`, which returns CPU parameters themselves: views of one optimizer buffer would then
    # share storage, which safetensors refuses).
    return {
        name: p.detach().to("cpu", copy=True).contiguous() for name, p in model.named_parameters() if p.requires_grad
    }


# ---- what is complete ----
def verify(folder: Path, *, hashes: bool = True) -> str:
    """Why `folder` is not a complete checkpoint ("" when it is): its manifest must list every file with the size
    (and, with `hashes`, the sha256) the file has now."""
    folder = Path(folder)
    try:
        manifest = json.loads((folder / MANIFEST_FILE).read_text(encoding="utf-8"))
        files = manifest["files"]
    except FileNotFoundError:
        if (folder / STATE_FILE).is_file() and (folder / TRAINING_STATE_FILE).is_file():
            return (
                f"written by an earlier Hone without {MANIFEST_FILE}: it cannot be resumed safely (its "
                f"{TRAINING_STATE_FILE} is a Python pickle, and loading one can run any code in it)"
            )
        return f"incomplete (no {MANIFEST_FILE}: the save did not finish)"
    except (OSError, ValueError, KeyError, TypeError):
        return f"damaged ({MANIFEST_FILE} cannot be read)"
    for name in _PAYLOAD_FILES:
        entry = files.get(name) if isinstance(files, dict) else None
        if not isinstance(entry, dict):
            return f"damaged ({MANIFEST_FILE} does not list {name})"
        path = folder / name
        try:
            size = path.stat().st_size
        except OSError:
            return f"incomplete ({name} is missing)"
        if size != entry.get("size"):
            return f"damaged ({name} is {size:,} bytes, the manifest says {entry.get('size')})"
        if hashes and _sha256(path) != entry.get("sha256"):
            return f"damaged ({name} does not match its sha256 in the manifest)"
    return ""


def _step_of(name: str) -> int | None:
    for prefix in ("", _OLD):
        if name.startswith(prefix + "step-") and name[len(prefix) + 5 :].isdigit():
            return int(name[len(prefix) + 5 :])
    return None


def checkpoint_report(run_dir: Path, *, hashes: bool = True) -> tuple[list[Path], dict[int, str]]:
    """(complete checkpoints oldest first, {step: why not} for step folders that are not).

    For each step, `step-N/` is read, or the `.old-step-N/` a same-step save left aside when it was killed between
    its two renames."""
    root = Path(run_dir) / CHECKPOINTS_DIR
    candidates: dict[int, list[Path]] = {}
    if root.is_dir():
        for d in sorted(root.iterdir(), key=lambda d: d.name.startswith(_OLD)):  # step-N before .old-step-N
            step = _step_of(d.name)
            if step is not None and d.is_dir():
                candidates.setdefault(step, []).append(d)
    complete, broken = [], {}
    for step in sorted(candidates):
        reasons = []
        for folder in candidates[step]:
            why = verify(folder, hashes=hashes)
            if not why:
                complete.append(folder)
                break
            reasons.append(why)
        else:
            broken[step] = reasons[0]
    return complete, broken


def complete_checkpoints(run_dir: Path) -> list[Path]:
    """Complete checkpoints of a run, oldest first, by their manifests' sizes (`checkpoint_report` for hashes)."""
    return checkpoint_report(run_dir, hashes=False)[0]


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The newest checkpoint whose manifest verifies (sizes and sha256), or None."""
    complete = checkpoint_report(run_dir)[0]
    return complete[-1] if complete else None


def resumable_checkpoint(run_dir: Path) -> tuple[Path | None, list[str]]:
    """The checkpoint a resume continues from, and a sentence for each newer step folder passed over.

    Returns (None, []) when the run saved no checkpoint yet.

    Raises:
        HoneError: the run has step folders but none of them can be resumed.
    """
    complete, broken = checkpoint_report(run_dir)
    newest = int(complete[-1].name.rsplit("-", 1)[1]) if complete else -1
    skipped = [
        f"checkpoint step-{step:06d} is {why}; resuming from {f'step {newest}' if complete else 'the start'} instead"
        for step, why in broken.items()
        if step > newest
    ]
    if not complete and broken:
        root = Path(run_dir) / CHECKPOINTS_DIR
        raise HoneError(
            f"no checkpoint in {root} can be resumed: "
            + "; ".join(f"step-{step:06d} is {why}" for step, why in broken.items()),
            f"start a new run, or move {root} away to train this run again from step 0",
        )
    return (complete[-1] if complete else None), skipped


# ---- saving ----
def _tidy(root: Path) -> None:
    """Finish what a killed save left: delete half-written and half-deleted folders, and put back a step folder
    set aside by a same-step save (or delete the aside once its replacement is complete)."""
    for d in sorted(root.iterdir()):
        if d.name.startswith((_TMP, _DEL)):
            _fault_point()
            shutil.rmtree(d, ignore_errors=True)
        elif d.name.startswith(_OLD) and _step_of(d.name) is not None:
            final = root / d.name[len(_OLD) :]
            if final.is_dir() and not verify(final, hashes=False):
                _fault_point()
                shutil.rmtree(d, ignore_errors=True)
                continue
            if final.exists():  # not complete, which no save leaves behind: out of the way, keep the aside
                _fault_point()
                os.replace(final, root / f"{_DEL}{final.name}")
            _fault_point()
            os.replace(d, final)
    _fsync_dir(root)


def _write_file(path: Path, data: bytes | memoryview) -> dict:
    """Write `data` to `path` and flush it to disk; its manifest entry. A full disk raises OSError with its errno
    (which torch's and safetensors' own file writers turn into errors that do not say so)."""
    _fault_point()
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    return {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def _write_folder(
    folder: Path,
    step: int,
    model,
    optimizer,
    scheduler,
    state: dict,
    scaler,
    rng_by_rank: list | None = None,
    objective_tensors: dict | None = None,
) -> None:
    """The checkpoint's files, serialized in memory first (a moment's copy of the trainable weights and the
    optimizer state in host memory), then written."""
    _fault_point()
    folder.mkdir()
    files = {WEIGHTS_FILE: _write_file(folder / WEIGHTS_FILE, save_tensors(trainable_state(model)))}
    buffer = io.BytesIO()
    torch.save(
        {
            "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict(),
            "scaler": scaler.state_dict() if scaler is not None else None,
            "rng": rng_state(),
            **({"rng_by_rank": rng_by_rank} if rng_by_rank else {}),
            **({"objective": objective_tensors} if objective_tensors else {}),
        },
        buffer,
    )
    files[TRAINING_STATE_FILE] = _write_file(folder / TRAINING_STATE_FILE, buffer.getbuffer())
    del buffer
    text = json.dumps(dict(state, step=step), indent=2, allow_nan=False)
    files[STATE_FILE] = _write_file(folder / STATE_FILE, text.encode("utf-8"))
    manifest = json.dumps({"hone_checkpoint": _FORMAT, "files": files}, indent=2)
    _write_file(folder / MANIFEST_FILE, manifest.encode("utf-8"))
    _fsync_dir(folder)


def save_checkpoint(
    run_dir: Path,
    step: int,
    model,
    optimizer,
    scheduler,
    state: dict,
    *,
    scaler=None,
    keep: int = 2,
    rng_by_rank: list | None = None,
    objective_tensors: dict | None = None,
) -> Path:
    """Write checkpoints/step-{step:06d} (replacing one of that step without a moment lacking it) and prune to the
    `keep` newest complete ones. Returns its path. The caller holds the run folder's lock (run_lock.py).
    `rng_by_rank`: the random state of each process of a run trained by several (hone.core.train.distributed).
    `objective_tensors`: what the run's objective keeps in tensors between steps (GRPO's answers inside a cycle),
    saved with the training state.

    Raises:
        HoneError: the disk is full (the half-written folder is removed again, the older checkpoints stay).
    """
    root = Path(run_dir) / CHECKPOINTS_DIR
    final = root / f"step-{step:06d}"
    tmp, aside = root / f"{_TMP}{final.name}", root / f"{_OLD}{final.name}"
    try:
        root.mkdir(parents=True, exist_ok=True)
        _tidy(root)
        _write_folder(tmp, step, model, optimizer, scheduler, state, scaler, rng_by_rank, objective_tensors)
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)  # frees the space it took, for run.json and the log
        if is_disk_full(e):
            raise disk_full_error(e, f"the checkpoint of step {step}", Path(run_dir)) from e
        raise
    if final.exists():
        _fault_point()
        os.replace(final, aside)
    _fault_point()
    os.replace(tmp, final)
    _fsync_dir(root)
    if aside.exists():
        _fault_point()
        shutil.rmtree(aside)
    for old in complete_checkpoints(run_dir)[:-keep]:
        doomed = root / f"{_DEL}{old.name}"
        _fault_point()
        os.replace(old, doomed)
        _fault_point()
        shutil.rmtree(doomed, ignore_errors=True)
    _fsync_dir(root)
    return final


# ---- loading ----

# state.json holds the run config and a line per training file (`resume_checks.data_fingerprint`): a folder of
# 100,000 files makes it about 20 MB. A larger one is not Hone's.
MAX_STATE_BYTES = 64 << 20
_STATE_RULES: dict[str, json_checks.Rule] = {
    "step": json_checks.count,
    "position": json_checks.count,
    "epoch": json_checks.count,
    "total_steps": json_checks.count,
    "config": json_checks.an_object,
    "data": json_checks.an_object,
    "layout": json_checks.an_object,
}
_LAYOUT_RULES = {"rows": json_checks.count, "tokens": json_checks.count, "batch_tokens": json_checks.count}
_FILE_RULES = {"name": json_checks.text, "size": json_checks.count, "sha256": json_checks.text}


def _data_problems(data: dict) -> list[str]:
    """What is wrong with a state.json's data fingerprint: {"train": [file, ...], "eval": [...]}, each file with its
    name, and its size and sha256 unless it is a Hub dataset's."""
    problems = json_checks.field_problems(
        data, {"train": json_checks.a_list, "eval": json_checks.a_list}, prefix="data."
    )
    for side in ("train", "eval"):
        files = data.get(side)
        for i, entry in enumerate(files if isinstance(files, list) else []):
            where = f"data.{side}[{i}]"
            if not isinstance(entry, dict):
                problems.append(f"{where} is {quoted(entry)}, not an object")
                continue
            required = ("name",) if entry.get("hub") else tuple(_FILE_RULES)
            problems += json_checks.field_problems(entry, _FILE_RULES, required, prefix=f"{where}.")
    return problems


def _damaged_checkpoint_advice(folder: Path) -> str:
    return (
        f"move {folder} out of {folder.parent} to resume from the checkpoint before it (a resume takes the newest "
        "complete one), or start a new run"
    )


def read_state(folder: Path) -> dict:
    """A checkpoint's state.json, every field a resume reads checked: step and data position (whole numbers, at
    least 0), epoch and total_steps, the recorded config, data fingerprint and layout.

    Raises:
        HoneError: state.json is missing, cannot be read whole, is no JSON object, or a field has another type or
            range; the message names the file and each field.
    """
    path = Path(folder) / STATE_FILE
    try:
        state = json_checks.read_object(path, MAX_STATE_BYTES)
    except json_checks.Damaged as e:
        raise HoneError(f"{path} {e}", _damaged_checkpoint_advice(Path(folder))) from None
    if state is None:
        raise HoneError(f"{path} is missing", _damaged_checkpoint_advice(Path(folder)))
    problems = json_checks.field_problems(state, _STATE_RULES, required=("step", "position"))
    if isinstance(state.get("layout"), dict):
        problems += json_checks.field_problems(state["layout"], _LAYOUT_RULES, prefix="layout.")
    if isinstance(state.get("data"), dict):
        problems += _data_problems(state["data"])
    if problems:
        raise HoneError(f"{path} is damaged: {'; '.join(problems[:5])}", _damaged_checkpoint_advice(Path(folder)))
    return state


def _read_weights(path: Path, params: dict) -> dict[str, torch.Tensor]:
    """The checkpoint's trainable tensors, each one a parameter of the model of its shape. Raises HoneError."""
    try:
        weights = load_file(path)
    except (SafetensorError, OSError) as e:
        raise HoneError(f"{path} cannot be read: {e}", _damaged_checkpoint_advice(path.parent)) from None
    missing = set(weights) - set(params)
    if missing:
        raise HoneError(
            f"checkpoint {path.parent} has tensors this model lacks: {sorted(missing)[:3]}",
            "resume with the model and LoRA settings the run was started with",
        )
    other = [name for name, tensor in weights.items() if tensor.shape != params[name].shape]
    if other:
        name = other[0]
        raise HoneError(
            f"{path} holds {name} of shape {tuple(weights[name].shape)}, the model's is {tuple(params[name].shape)}",
            "resume with the model and LoRA settings the run was started with",
        )
    return weights


def _read_training_state(path: Path) -> dict:
    """training_state.pt as tensors and plain values only, with the optimizer, scheduler and RNG states a resume
    restores. Raises HoneError."""
    try:
        training = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        found = re.search(r"WeightsUnpickler error: ([^\n]*?)(?:\. |\n|$)", str(e))
        raise HoneError(
            f"{path} holds Python objects besides tensors and plain values, and loading it "
            f"could run code, so Hone does not{f' ({found[1]})' if found else ''}",
            "if you did not write this checkpoint, do not trust the folder; start a new run",
        ) from None
    except (RuntimeError, EOFError, OSError, ValueError) as e:
        raise HoneError(f"{path} cannot be read: {e}", _damaged_checkpoint_advice(path.parent)) from None
    if not isinstance(training, dict):
        raise HoneError(
            f"{path} holds a {type(training).__name__}, not the training state", _damaged_checkpoint_advice(path.parent)
        )
    for key in ("optimizer", "scheduler", "rng"):
        if not isinstance(training.get(key), dict):
            raise HoneError(f"{path} has no {key} state", _damaged_checkpoint_advice(path.parent))
    return training


def load_checkpoint(path: Path, model, optimizer, scheduler, *, scaler=None, rank: int = 0) -> dict:
    """Restore model weights, optimizer, scheduler, scaler and RNG from `path` (one `resumable_checkpoint` chose);
    returns its state.json (`read_state`), with the objective's tensors under "objective_tensors" where the checkpoint
    holds any. `rank`: which process's random state to take, when several trained the run.

    Raises:
        HoneError: state.json, the weights or training_state.pt cannot be read or hold what no checkpoint of this
            run holds (a tensor the model lacks, a state that does not fit its optimizer); training_state.pt holds
            anything but tensors and plain values (loading it could run code).
    """
    path = Path(path)
    state = read_state(path)  # first: every file is read and checked before the model or optimizer changes
    params = dict(model.named_parameters())
    weights = _read_weights(path / WEIGHTS_FILE, params)
    training_file = path / TRAINING_STATE_FILE
    training = _read_training_state(training_file)
    with torch.no_grad():
        for name, tensor in weights.items():
            params[name].copy_(tensor.to(params[name].device))
    what = "optimizer"
    try:
        optimizer.load_state_dict(training["optimizer"])
        what = "scheduler"
        scheduler.load_state_dict(training["scheduler"])
        what = "loss scaler"
        if scaler is not None and training.get("scaler") is not None:
            scaler.load_state_dict(training["scaler"])
        what = "random-number (rng)"
        by_rank = training.get("rng_by_rank") or []
        set_rng_state(by_rank[rank] if isinstance(by_rank, list) and rank < len(by_rank) else training["rng"])
    except (KeyError, TypeError, ValueError, IndexError, RuntimeError) as e:
        raise HoneError(
            f"{training_file} holds a {what} state that cannot be restored ({type(e).__name__}: {str(e)[:200]})",
            _damaged_checkpoint_advice(path),
        ) from None
    if isinstance(training.get("objective"), dict):
        state = dict(state, objective_tensors=training["objective"])
    return state
