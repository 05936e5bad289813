"""The run an export reads (config, adapter, base model) and the folder it writes (staged, never clobbered).

An export writes into a hidden sibling folder and renames it into place only when everything was written, so an
interrupted export leaves no half-written output (staging.py). An existing output folder is replaced only with
`force`, and only when an earlier export wrote it (it holds export.json): `--force` never deletes a folder of the
user's. An export of a run that is still training (a resume going on) names the step its adapter was saved at.

Before anything loads, the run's adapter files are checked (adapter_config.json is a JSON object; the safetensors
header reads and the file holds every tensor it lists) and the output folder's parent must be writable; a damaged
file, a read-only folder or a full disk is an ExportError naming the file or folder, never a traceback.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from hone.core.config import RunConfig
from hone.core.export.checks import CheckLog
from hone.core.export.formats import MANIFEST_FILE, ExportError, ExportResult, ExportSpec
from hone.core.export.staging import check_space, staged, staging_notes  # noqa: F401  (the exporters take them here)
from hone.core.train.adapter_dir import base_model
from hone.core.train.run_dir import ADAPTER_DIR, CONFIG_FILE, INTERRUPTED, live_summary
from hone.core.train.run_lock import in_use
from hone.core.version import __version__

Progress = Callable[[str, float], None]
EXPORTS_DIR = "exports"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
ADAPTER_CONFIG = "adapter_config.json"
# safetensors refuses headers above 100 MB; a length above it is a damaged file, not a header to read.
_SAFETENSORS_HEADER_MAX = 100 * 1024 * 1024
# The adapter's model card (hone.core.train.adapter_dir) states the step it was saved at in this table row.
_CARD_STEPS = re.compile(r"^\| steps \| (\d+) \|$", re.MULTILINE)


@dataclass
class RunSource:
    """A finished (or stopped) run that has an adapter to export."""

    run_dir: Path
    config: RunConfig
    adapter_dir: Path

    @property
    def name(self) -> str:
        return self.run_dir.name

    @property
    def adapter_step(self) -> int | None:
        """The training step the adapter was saved at, from its model card; None when the card does not say."""
        try:
            found = _CARD_STEPS.search((self.adapter_dir / "README.md").read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError):
            return None
        return int(found.group(1)) if found else None

    def training_note(self) -> str | None:
        """A sentence when a process trains in the run folder right now (a resume going on): the export then holds
        the adapter saved earlier, at `adapter_step`, not the training in progress. None otherwise."""
        if in_use(self.run_dir) is not True:
            return None
        summary = live_summary(self.run_dir)
        now = f", now at step {summary.step}" if summary and summary.step else ""
        step = self.adapter_step
        saved = f"saved at step {step}" if step is not None else "saved before this training started"
        return (
            f"run {self.name} is still training{now}: this export holds its adapter {saved}, not the training "
            "going on; export again once the run has finished for its newer adapter"
        )

    @property
    def adapter_config(self) -> dict:
        return json.loads((self.adapter_dir / ADAPTER_CONFIG).read_text(encoding="utf-8"))

    def load_base(self):
        """The base model in float32 on the CPU, eval mode, with its tokenizer (a hone.core.models.load.LoadedModel).

        Exports compute in float32 so the checks measure the format, not the arithmetic.
        """
        from hone.core.models.load import load_model

        model_cfg = dataclasses.replace(self.config.model, dtype="float32")
        return load_model(model_cfg, device="cpu", for_training=False)

    def tokenizer(self, fallback=None):
        """The tokenizer saved with the adapter (it carries the chat template the run trained with)."""
        from transformers import AutoTokenizer

        if (self.adapter_dir / "tokenizer_config.json").is_file():
            try:
                return AutoTokenizer.from_pretrained(self.adapter_dir)
            except (OSError, ValueError, KeyError) as e:  # json.JSONDecodeError is a ValueError
                raise ExportError(
                    f"the tokenizer files in {self.adapter_dir} cannot be read ({type(e).__name__}: {e})",
                    _damaged_advice(self.run_dir),
                ) from None
        if fallback is None:
            raise ExportError(f"{self.adapter_dir} holds no tokenizer files", "re-save the adapter with its tokenizer")
        return fallback


def open_run(run_dir: str | Path) -> RunSource:
    """Check that `run_dir` is a run folder with an adapter and read its config.

    Raises:
        ExportError: the folder is missing, is not a run, or has no adapter yet (with what to do about it).
    """
    run_dir = Path(run_dir).expanduser()
    if not run_dir.is_dir():
        raise ExportError(f"{run_dir} does not exist", "give the folder of a run (runs/<name>)")
    if not (run_dir / CONFIG_FILE).is_file():
        raise ExportError(
            f"{run_dir} is not a run folder (it has no {CONFIG_FILE})", "give the folder `hone train` wrote for the run"
        )
    config = RunConfig.load(run_dir / CONFIG_FILE)
    adapter_dir = run_dir / ADAPTER_DIR
    missing = [f for f in (ADAPTER_CONFIG, ADAPTER_WEIGHTS) if not (adapter_dir / f).is_file()]
    if missing:
        summary = live_summary(run_dir)
        status = summary.status if summary else "unknown"
        if status == "running":
            advice = "the run is still training: wait for it to finish, or stop it (stopping saves the adapter)"
        elif status == INTERRUPTED:
            advice = (
                f"the run was interrupted at step {summary.step} ({summary.reason}): resume it with "
                f"`hone train --resume {run_dir}`"
            )
        elif status == "failed":
            advice = f"the run failed ({summary.reason}); fix that and train again"
        else:
            advice = f"finish or resume the run first: `hone train --resume {run_dir}`"
        raise ExportError(
            f"run {run_dir.name} has no adapter to export ({adapter_dir / missing[0]} is missing)", advice
        )
    for path, damage in (
        (adapter_dir / ADAPTER_CONFIG, _json_object_damage),
        (adapter_dir / ADAPTER_WEIGHTS, safetensors_damage),
    ):
        reason = damage(path)
        if reason:
            raise ExportError(f"{path} is damaged: {reason}", _damaged_advice(run_dir))
    return RunSource(run_dir=run_dir, config=config, adapter_dir=adapter_dir)


def _damaged_advice(run_dir: Path) -> str:
    return (
        "the adapter was not written completely (a run killed while saving, a full disk, a copy that stopped): "
        "copy the run folder again if it came from elsewhere, or write the adapter again with "
        f"`hone train --resume {run_dir}` (from the run's last checkpoint)"
    )


def _json_object_damage(path: Path) -> str | None:
    """Why `path` is not a JSON object, in words, or None."""
    try:
        value = json.loads(path.read_bytes().decode("utf-8"))
    except UnicodeDecodeError as e:
        return f"byte {e.start} is not UTF-8 text"
    except json.JSONDecodeError as e:
        return f"it is not valid JSON ({e.msg} at line {e.lineno}, column {e.colno})"
    return None if isinstance(value, dict) else f"it holds a JSON {type(value).__name__}, not an object"


def safetensors_damage(path: Path) -> str | None:
    """Why `path` is not a whole safetensors file, in words, or None: the 8-byte header length, the JSON header
    and the data of every tensor it lists must all be in the file (expected and actual size given)."""
    size = path.stat().st_size
    if size < 8:
        return f"it has {size} bytes, fewer than the 8 that give a safetensors header's length"
    with open(path, "rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        if length > _SAFETENSORS_HEADER_MAX or 8 + length > size:
            return (
                f"its first 8 bytes announce a {length:,}-byte header, but the file has {size:,} bytes in all "
                "(cut short, or not a safetensors file)"
            )
        raw = f.read(length)
    try:
        header = json.loads(raw.decode("utf-8"))
        ends = [int(entry["data_offsets"][1]) for name, entry in header.items() if name != "__metadata__"]
    except (UnicodeDecodeError, ValueError, KeyError, TypeError, IndexError, AttributeError):
        return "its header is not the JSON table of tensors a safetensors file starts with"
    expected = 8 + length + max(ends, default=0)
    if size < expected:
        return (
            f"it is cut short: it should have {expected:,} bytes (to the end of the last of its {len(ends)} "
            f"tensors) but has {size:,} ({expected - size:,} missing)"
        )
    return None


def output_folder(run: RunSource, spec: ExportSpec, out: str | Path | None, force: bool) -> Path:
    """Where this export goes (default RUN_DIR/exports/<format>[-type]); refuse early if it is in the way."""
    out = Path(out).expanduser() if out is not None else run.run_dir / EXPORTS_DIR / spec.folder_name
    if out.exists() and not out.is_dir():
        raise ExportError(f"{out} exists and is a file", "choose another --out folder")
    parent = out.parent  # where the export is staged and then renamed into place
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if parent.exists() and not os.access(parent, os.W_OK | os.X_OK):
        raise ExportError(
            f"cannot write the export to {out}: {parent} is read-only for you",
            "choose an --out folder you can write to (or make that folder writable)",
        )
    if out.is_dir() and any(out.iterdir()):
        if not force:
            raise ExportError(f"{out} already exists", "pass --force to replace it, or choose another --out")
        if not (out / MANIFEST_FILE).is_file():
            raise ExportError(
                f"{out} is not empty and was not written by `hone export` (no {MANIFEST_FILE}), so "
                "--force will not replace it",
                "choose another --out folder",
            )
    return out


def finish(folder: Path, out: Path, run: RunSource, spec: ExportSpec, log: CheckLog) -> ExportResult:
    """Write export.json (what, from which run and step, every check) into the staging `folder` and build the
    result. An export of a run that is still training says so in export.json, the result's notes and the model
    card (README.md) when the export has one.

    File paths in the result point at `out`, where `folder` is about to be moved.
    """
    step, training = run.adapter_step, run.training_note()
    manifest = {
        "format": spec.label,
        "run": str(run.run_dir.resolve()),
        "adapter_step": step,
        "run_still_training": training is not None,
        "base_model": base_model(run.config.model).name,
        "hone_version": __version__,
        "written": time.strftime("%Y-%m-%d %H:%M:%S"),
        "passed": log.passed,
        "failures": log.failures,
        "checks": log.checks,
    }
    (folder / MANIFEST_FILE).write_text(json.dumps(manifest, indent=2), encoding="utf-8")
    card = folder / "README.md"
    if training is not None and card.is_file():
        with open(card, "a", encoding="utf-8") as f:
            f.write(f"\n> Exported while the run was still training: {training}.\n")
    files = sorted(out / p.relative_to(folder) for p in folder.rglob("*") if p.is_file())
    return ExportResult(
        path=out,
        format=spec.label,
        files=files,
        checks=dict(log.checks),
        passed=log.passed,
        failures=list(log.failures),
        step=step,
        notes=[*([training] if training else []), *staging_notes(folder)],
    )


class Steps:
    """Maps named stages of an export onto one 0..1 progress callback.

    Args:
        progress: called as progress(stage description, overall fraction done); may be None.
        weights: stage name -> relative cost, in the order the stages run.
    """

    def __init__(self, progress: Progress | None, weights: dict[str, float]):
        self.progress = progress
        total = sum(weights.values())
        self.starts, self.sizes, done = {}, {}, 0.0
        for name, weight in weights.items():
            self.starts[name], self.sizes[name] = done / total, weight / total
            done += weight
        self.current = next(iter(weights))

    def start(self, name: str) -> None:
        self.current = name
        self._report(0.0)

    def within(self, fraction: float) -> None:
        """Report progress inside the current stage (0..1)."""
        self._report(min(max(fraction, 0.0), 1.0))

    def done(self) -> None:
        if self.progress:
            self.progress("done", 1.0)

    def _report(self, fraction: float) -> None:
        if self.progress:
            self.progress(self.current, self.starts[self.current] + fraction * self.sizes[self.current])
