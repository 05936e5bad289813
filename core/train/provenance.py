"""What a run was made from: provenance.json in the run folder, written once as a new run starts.

It holds the model's revision (the Hub commit when the model comes from the Hub cache, else a fingerprint of its
weight files), the versions of the libraries that decide the numbers, Python, the OS, the GPU, its driver and CUDA,
and the seed. With config.toml and the data hashes each checkpoint records (resume_checks.py), it is what
`hone train --rerun RUN_DIR` compares a new run against (`rerun_differences`).

Nothing here stops a run: a field that cannot be read is recorded as null and `unknown` says why. Nothing here
reads a weight file's bytes (tens of GB on the critical path): the fingerprint hashes names, sizes and mtimes.
Stdlib only (torch is asked only when it is already imported), so the run history can read it without torch.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import platform
import re
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Any

from hone.core.config import RunConfig
from hone.core.version import __version__

__all__ = [
    "PROVENANCE_FILE",
    "build_provenance",
    "first_step_loss",
    "model_revision",
    "read_provenance",
    "rerun_differences",
    "rerun_report",
    "write_provenance",
]

PROVENANCE_FILE = "provenance.json"
FORMAT = 1  # bumped when a field changes meaning; readers compare only runs of the same format
MAX_PROVENANCE_BYTES = 1 << 20  # a provenance.json is a few KB; more is not one Hone wrote
# The distributions whose versions change what a step computes; "hone" is this checkout's own version.
LIBRARIES = ("torch", "transformers", "peft", "bitsandbytes", "triton", "accelerate")
# Files whose stat makes a model folder's fingerprint: the weights (and what decides how they load).
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".gguf", ".pt", ".pth", ".json", ".model")
_COMMIT = re.compile(r"[0-9a-f]{40}")


def _stat_fingerprint(files: list[Path], root: Path) -> str:
    """sha256 over each file's path relative to `root`, size and mtime (ns): changes when a file is replaced,
    without reading its bytes."""
    digest = hashlib.sha256()
    for path in sorted(files):
        st = path.stat()
        digest.update(f"{path.relative_to(root).as_posix()}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return digest.hexdigest()


def _hub_cache() -> Path:
    """The Hugging Face cache transformers reads from (hone.core.hub.connection.cache_dir, which train may not
    import)."""
    for key in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if os.environ.get(key):
            return Path(os.environ[key]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    try:
        from huggingface_hub import constants

        return Path(constants.HF_HUB_CACHE)
    except Exception:  # not installed or broken: the documented default
        return Path.home() / ".cache" / "huggingface" / "hub"


def _folder_facts(folder: Path, gguf_file: str) -> dict[str, Any]:
    if gguf_file:
        files = [folder / gguf_file]
    else:
        files = [p for p in folder.rglob("*") if p.is_file() and p.suffix in WEIGHT_SUFFIXES]
    if not files:
        raise OSError(f"{folder} holds no weight files ({', '.join(WEIGHT_SUFFIXES)})")
    return {"fingerprint": _stat_fingerprint(files, folder), "files": len(files)}


def model_revision(name_or_path: str, revision: str = "", gguf_file: str = "") -> tuple[dict[str, Any], str]:
    """What identifies the model's weights, cheaply, and why a part could not be read ("" when all could).

    Returns ({"source": "hub" | "folder" | "file", "revision": Hub commit or None, "fingerprint": sha256 of the
    weight files' names, sizes and mtimes or None, "files": how many went into it, and for a local model its
    resolved "path"}, why).
    """
    facts: dict[str, Any] = {"source": "", "revision": None, "fingerprint": None, "files": 0}
    path = Path(name_or_path).expanduser()
    try:
        if path.exists():
            facts["path"] = str(path.resolve())  # a relative name_or_path means another folder from elsewhere
        if path.is_file():
            facts["source"] = "file"
            facts.update(_folder_facts(path.parent, path.name))
            return facts, ""
        if path.is_dir():
            facts["source"] = "folder"
            resolved = path.resolve()
            if resolved.parent.name == "snapshots" and _COMMIT.fullmatch(resolved.name):
                facts["revision"] = resolved.name  # a snapshot folder of the Hub cache is named by its commit
            facts.update(_folder_facts(path, gguf_file))
            return facts, ""
        facts["source"] = "hub"
        storage = _hub_cache() / f"models--{name_or_path.replace('/', '--')}"
        wanted = revision or "main"
        if _COMMIT.fullmatch(wanted):
            commit = wanted
        else:
            ref = storage / "refs" / wanted
            if not ref.is_file():
                return facts, f"{name_or_path} at {wanted!r} is not in the Hugging Face cache ({ref} is missing)"
            commit = ref.read_text(encoding="utf-8").strip()
        facts["revision"] = commit
        snapshot = storage / "snapshots" / commit
        if snapshot.is_dir():
            facts.update(_folder_facts(snapshot, gguf_file))
        return facts, ""
    except OSError as e:
        return facts, f"{name_or_path}: {e.strerror or e}"


def _versions() -> tuple[dict[str, str | None], dict[str, str]]:
    found: dict[str, str | None] = {"hone": __version__, "python": platform.python_version()}
    unknown: dict[str, str] = {}
    for name in LIBRARIES:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name], unknown[f"versions.{name}"] = None, "not installed"
        except Exception as e:  # a broken install's metadata
            found[name], unknown[f"versions.{name}"] = None, f"{type(e).__name__}: {e}"
    return found, unknown


def _driver_version() -> tuple[str | None, str]:
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception as e:
        return None, f"NVML is not available ({type(e).__name__}: {e}); install nvidia-ml-py"
    try:
        version = pynvml.nvmlSystemGetDriverVersion()
        return (version.decode() if isinstance(version, bytes) else str(version)), ""
    except Exception as e:
        return None, f"NVML did not say ({type(e).__name__}: {e})"
    finally:
        with contextlib.suppress(Exception):
            pynvml.nvmlShutdown()


def _gpu(device: str) -> tuple[dict[str, Any] | None, dict[str, str]]:
    """The GPU the run trains on: name, driver and the CUDA version torch was built for; None on the CPU."""
    if not device.startswith("cuda"):
        return None, {"gpu": f"the run trains on {device}, not a GPU"}
    gpu: dict[str, Any] = {"name": None, "driver": None, "cuda": None}
    unknown: dict[str, str] = {}
    torch = sys.modules.get("torch")  # the trainer has imported it; this module never does
    try:
        if torch is None:
            raise RuntimeError("torch is not loaded")
        index = int(device.split(":")[1]) if ":" in device else torch.cuda.current_device()
        gpu["name"] = torch.cuda.get_device_name(index)
        gpu["cuda"] = torch.version.cuda
    except Exception as e:
        unknown["gpu.name"] = unknown["gpu.cuda"] = f"{type(e).__name__}: {e}"
    gpu["driver"], why = _driver_version()
    if why:
        unknown["gpu.driver"] = why
    return gpu, unknown


def build_provenance(config: RunConfig, device: str) -> dict[str, Any]:
    """What the run is made from, as a JSON-ready dict. Never raises for what it cannot read: that field is None
    and `unknown[field]` says why."""
    model = config.model
    revision, why = model_revision(model.name_or_path, model.revision, model.gguf_file)
    unknown: dict[str, str] = {"model": why} if why else {}
    versions, missing = _versions()
    unknown.update(missing)
    gpu, missing = _gpu(device)
    unknown.update(missing)
    return {
        "format": FORMAT,
        "recorded": time.time(),
        "seed": config.train.seed,
        "model": {"name_or_path": model.name_or_path, "requested_revision": model.revision, **revision},
        "versions": versions,
        "os": platform.platform(),
        "device": device,
        "gpu": gpu,
        "unknown": unknown,
    }


def write_provenance(run_dir: Path, config: RunConfig, device: str, log=None) -> tuple[Path | None, str]:
    """Write provenance.json into `run_dir` (atomically) unless it is there already (a resumed run keeps what it was
    started from). Returns (the file, "") or (None, why it could not be written, also handed to `log`): the run
    goes on either way."""
    from hone.core.train.run_dir import write_json_atomic

    path = Path(run_dir) / PROVENANCE_FILE
    if path.exists():
        return path, ""
    try:
        write_json_atomic(path, build_provenance(config, device))
    except Exception as e:  # a full disk, a value json cannot hold: recorded as missing, never the run's failure
        why = f"{path} could not be written ({type(e).__name__}: {e}); the run goes on without it"
        if log is not None:
            log(why)
        return None, why
    return path, ""


def read_provenance(run_dir: Path) -> tuple[dict[str, Any] | None, str]:
    """A run's provenance.json, or (None, why not): a run from before it was recorded, or a damaged file."""
    path = Path(run_dir) / PROVENANCE_FILE
    try:
        if path.stat().st_size > MAX_PROVENANCE_BYTES:
            return None, f"{path} is larger than {MAX_PROVENANCE_BYTES:,} bytes: damaged"
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None, f"{path} is missing (the run was made before Hone recorded it)"
    except (OSError, UnicodeDecodeError, ValueError) as e:
        return None, f"{path} is damaged ({type(e).__name__}: {e})"
    if not isinstance(data, dict):
        return None, f"{path} is damaged (not a JSON object)"
    return data, ""


def _flat(data: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(data, dict):
        return {prefix: data}
    out: dict[str, Any] = {}
    for key, value in data.items():
        out.update(_flat(value, f"{prefix}.{key}" if prefix else str(key)))
    return out


# What may differ between two runs without saying anything about how they compute: when and where they ran.
_NOT_COMPARED = ("format", "recorded", "unknown", "model.requested_revision")


def rerun_differences(original: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """Each recorded fact that differs between two provenance dicts, as "versions.torch: 2.11.0 → 2.13.0"."""
    before, after = _flat(original), _flat(new)
    lines = []
    for key in sorted(set(before) | set(after)):
        if key.startswith(_NOT_COMPARED):
            continue
        if before.get(key) != after.get(key):
            lines.append(f"{key}: {before.get(key)} → {after.get(key)}")
    return lines


def first_step_loss(run_dir: Path) -> tuple[float | None, str]:
    """The loss of step 1 in a run's metrics.jsonl, or (None, why not)."""
    from hone.core import events
    from hone.core.train.run_dir import METRICS_FILE, EventTail

    tail = EventTail(run_dir)
    for event in tail.read():
        if isinstance(event, events.StepMetrics) and event.step == 1:
            return event.loss, ""
    skipped = tail.skipped_note()
    return None, f"{Path(run_dir) / METRICS_FILE} holds no step 1" + (f"; {skipped}" if skipped else "")


def rerun_report(
    original_dir: Path, original_loss: float | None, why: str, new_dir: Path, loss: float
) -> tuple[bool, list[str]]:
    """What `hone train --rerun` says after the new run's first step: whether its loss matches the original's
    exactly, and lines for the user: the verdict first, then each recorded fact (provenance.json) that differs."""
    if original_loss is None:
        lines = [f"first-step loss {loss:.6g}: not compared, {why}"]
    elif loss == original_loss:
        lines = [f"first-step loss {loss!r} matches the original's ({original_dir}) exactly"]
    else:
        gap = abs(loss - original_loss)
        relative = gap / abs(original_loss) if original_loss else float("inf")
        lines = [
            f"first-step loss {loss!r} differs from the original's {original_loss!r} ({original_dir}) by "
            f"{gap:.3g} ({relative:.2e} relative)"
        ]
    before, why_before = read_provenance(original_dir)
    after, why_after = read_provenance(new_dir)
    if before is None or after is None:
        lines.append(f"recorded versions not compared: {why_before or why_after}")
        return loss == original_loss, lines
    differences = rerun_differences(before, after)
    lines.append("what differs from the original: " + ("; ".join(differences) if differences else "nothing recorded"))
    return loss == original_loss, lines
