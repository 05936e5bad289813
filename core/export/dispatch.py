"""`export_run`: one entry point that parses the format and calls that format's exporter, for the run's final adapter
or for one of its saved checkpoints.

A checkpoint holds the trainable tensors (hone.core.train.checkpoints), not a PEFT folder. To export one, its adapter
is rebuilt as the trainer builds it (the base model, `apply_lora` with the run's settings, the checkpoint's tensors
copied in) and saved as the trainer saves the final adapter (`save_adapter`), into a copy of the run folder made
for the export (hidden, in the run folder, removed afterwards); the format's exporter then reads that copy as it
reads any run. The export's export.json and model card name the checkpoint's step, its scores and their data.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

from hone.core.export.card import CARD_FILE, checkpoint_section, model_card
from hone.core.export.formats import MANIFEST_FILE, ExportError, ExportResult, ExportSpec, parse_format
from hone.core.export.source import EXPORTS_DIR, Progress, RunSource, output_folder
from hone.core.train.run_dir import ADAPTER_DIR, CHECKPOINTS_DIR, CONFIG_FILE


def export_run(
    run_dir: str | Path,
    fmt: str,
    out: str | Path | None = None,
    *,
    force: bool = False,
    progress: Progress | None = None,
    checkpoint: int | None = None,
    scores: dict | None = None,
) -> ExportResult:
    """Export a run in one format and read the result back.

    Args:
        run_dir: the run folder (config.toml + adapter/, or checkpoints/ for a `checkpoint`).
        fmt: "adapter", "merged[:bf16|f16]", "gguf[:TYPE]", "gguf-lora[:f32|f16|bf16]" or "ollama[:TYPE]"
            (TYPE: see GGUF_TYPES; default q8_0).
        out: output folder; default RUN_DIR/exports/<format>[-type] (with a checkpoint: ...-step-N).
        force: replace an output folder an earlier export wrote (never a folder it did not write).
        progress: called as progress(stage description, overall fraction 0..1), from the exporting thread. To
            cancel, raise from it: the half-written output folder is removed and the exception propagates.
        checkpoint: export the adapter of the checkpoint saved at this step instead of the final adapter.
        scores: that checkpoint's stored scores (a score entry as a dict: "metrics", "data", "scored"), for the
            model card and export.json; None when it was not scored.

    Returns:
        ExportResult; `passed` is False when a read-back check failed (the files stay for inspection).

    Raises:
        ExportError: unknown format or type, unsupported model, run without adapter, no complete checkpoint of that
            step, output folder in the way.
    """
    spec = parse_format(fmt)
    if checkpoint is not None:
        return _export_checkpoint(Path(run_dir).expanduser(), spec, checkpoint, scores, out, force, progress)
    return _export(run_dir, spec, out, force, progress)


def _export(run_dir, spec: ExportSpec, out, force: bool, progress: Progress | None) -> ExportResult:
    kwargs = dict(out=out, force=force, progress=progress)
    if spec.format == "adapter":
        from hone.core.export.adapter import export_adapter

        return export_adapter(run_dir, **kwargs)
    if spec.format == "merged":
        from hone.core.export.merged_model import export_merged

        return export_merged(run_dir, dtype=spec.type, **kwargs)
    if spec.format == "gguf":
        from hone.core.export.gguf_model import export_gguf

        return export_gguf(run_dir, qtype=spec.type, **kwargs)
    if spec.format == "gguf-lora":
        from hone.core.export.gguf_lora import export_gguf_lora

        return export_gguf_lora(run_dir, dtype=spec.type, **kwargs)
    from hone.core.export.ollama import export_ollama

    return export_ollama(run_dir, qtype=spec.type, **kwargs)


def checkpoint_output(
    run_dir: str | Path, fmt: str, step: int, out: str | Path | None = None, *, force: bool = False
) -> Path:
    """Where an export of the checkpoint of `step` goes: `out`, by default RUN_DIR/exports/<format>[-type]-step-N
    beside the final adapter's exports. Light: no model loads.

    Raises:
        ExportError: `run_dir` is no run folder, or the output folder is in the way (as `output_folder`).
    """
    from hone.core.config import RunConfig

    run_dir = Path(run_dir).expanduser()
    if not (run_dir / CONFIG_FILE).is_file():
        raise ExportError(
            f"{run_dir} is not a run folder (it has no {CONFIG_FILE})", "give the folder `hone train` wrote for the run"
        )
    spec = parse_format(fmt)
    out = Path(out).expanduser() if out is not None else run_dir / EXPORTS_DIR / f"{spec.folder_name}-step-{step}"
    config = RunConfig.load(run_dir / CONFIG_FILE)
    return output_folder(RunSource(run_dir, config, run_dir / ADAPTER_DIR), spec, out, force)


def _export_checkpoint(
    run_dir: Path, spec: ExportSpec, step: int, scores: dict | None, out, force: bool, progress: Progress | None
) -> ExportResult:
    from hone.core.config import RunConfig

    out = checkpoint_output(run_dir, spec.label, step, out, force=force)  # in the way: said before anything loads
    config = RunConfig.load(run_dir / CONFIG_FILE)
    folder = checkpoint_folder(run_dir, step)
    if progress is not None:
        progress(f"rebuilding the adapter of step {step}", 0.0)
    # Beside the run (same disk) where the run folder can be written; else in the system's temporary folder.
    place = run_dir if os.access(run_dir, os.W_OK | os.X_OK) else None
    with tempfile.TemporaryDirectory(prefix=".checkpoint-export-", dir=place) as tmp:
        view = Path(tmp) / run_dir.name  # the run's name: the exporters title cards and Ollama models by it
        view.mkdir()
        shutil.copy2(run_dir / CONFIG_FILE, view / CONFIG_FILE)
        write_checkpoint_adapter(config, folder, step, view / ADAPTER_DIR)
        result = _export(view, spec, out, force, progress)
    _name_checkpoint(result, run_dir, config, spec, step, scores)
    return result


def checkpoint_folder(run_dir: Path, step: int) -> Path:
    """The complete checkpoint of `step` (its manifest verified, sha256 included).

    Raises:
        ExportError: there is none; the message lists the steps there are.
    """
    from hone.core.train.checkpoints import checkpoint_report

    complete, broken = checkpoint_report(run_dir)
    for folder in complete:
        if int(folder.name.rsplit("-", 1)[1]) == step:
            return folder
    if step in broken:
        raise ExportError(
            f"checkpoint step-{step:06d} of run {run_dir.name} is {broken[step]}",
            "export another checkpoint, or the run's final adapter (leave --checkpoint out)",
        )
    steps = ", ".join(f.name.rsplit("-", 1)[1].lstrip("0") or "0" for f in complete)
    raise ExportError(
        f"run {run_dir.name} has no checkpoint of step {step} in {run_dir / CHECKPOINTS_DIR}",
        f"its checkpoints are of steps {steps}" if steps else "the run saved no checkpoint; export its final adapter",
    )


def write_checkpoint_adapter(config, folder: Path, step: int, target: Path) -> Path:
    """Rebuild the PEFT adapter of checkpoint `folder` into `target`: the base model's structure on the meta device
    (no weight read), the LoRA the run trained laid out on it (`apply_lora`, its settings), the checkpoint's
    trainable tensors put in its place, saved with the tokenizer and a model card saying `step`.

    Raises:
        ExportError: the checkpoint holds a tensor the rebuilt model lacks or of another shape (the run's config.toml
            was changed since), or its weights cannot be read.
    """
    import torch
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    from hone.core.data.template import apply_template_setting
    from hone.core.models.load import load_tokenizer, model_skeleton
    from hone.core.train.adapter_dir import save_adapter
    from hone.core.train.checkpoints import WEIGHTS_FILE
    from hone.core.train.lora import apply_lora

    loaded = model_skeleton(config.model)
    final = folder.parent.parent / ADAPTER_DIR  # the tokenizer saved with the final adapter has the run's template
    if (final / "tokenizer_config.json").is_file() and not hasattr(loaded.tokenizer, "tokenizer"):
        tokenizer = load_tokenizer(str(final), None, config.model)
    else:
        tokenizer = loaded.tokenizer
        apply_template_setting(tokenizer, config.data.chat_template)
    with torch.device("meta"):  # the LoRA's own tensors too: every one is replaced by the checkpoint's
        model, _ = apply_lora(loaded.model, config.lora, loaded.info)
    path = folder / WEIGHTS_FILE
    try:
        weights = load_file(path)
    except (SafetensorError, OSError) as e:
        raise ExportError(f"{path} cannot be read: {e}", "export another checkpoint") from None
    params = dict(model.named_parameters())
    lacking = sorted(set(weights) - set(params))
    other = [n for n, t in weights.items() if n in params and t.shape != params[n].shape]
    untrained = sorted(n for n, p in params.items() if p.requires_grad and n not in weights)
    if lacking or other or untrained:
        what = (
            f"tensors the run's LoRA lacks: {lacking[:3]}"
            if lacking
            else f"{other[0]} of another shape"
            if other
            else f"no tensor for {untrained[:3]}"
        )
        raise ExportError(
            f"{path} does not fit the LoRA of the run's config.toml: {what}",
            "the run's config.toml (model, lora) was changed after training: put back the settings it trained with",
        )
    model.load_state_dict(weights, strict=False, assign=True)  # the checkpoint's tensors become the parameters
    return save_adapter(model, tokenizer, target, config, steps=step, final_loss=None)


def _replace_text(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def _name_checkpoint(
    result: ExportResult, run_dir: Path, config, spec: ExportSpec, step: int, scores: dict | None
) -> None:
    """Point export.json at the run (not the copy the exporter read) with the checkpoint and its scores, and add the
    checkpoint's section to the model card (writing the format's card first where the exporter writes none)."""
    from hone.core.train.adapter_dir import base_model

    out = result.path
    manifest = json.loads((out / MANIFEST_FILE).read_text(encoding="utf-8"))
    manifest["run"] = str(run_dir.resolve())
    manifest["checkpoint"] = {"step": step, "scores": scores}
    _replace_text(out / MANIFEST_FILE, json.dumps(manifest, indent=2))
    card = out / CARD_FILE
    section = checkpoint_section(run_dir.name, step, scores)
    if card.is_file():
        _replace_text(card, card.read_text(encoding="utf-8") + section)
    else:
        gguf = next((p.name for p in sorted(out.glob("*.gguf"))), "")
        _replace_text(card, model_card(spec.label, base_model(config.model).name, run_dir.name, gguf) + section)
        result.files = sorted([*result.files, card])
    result.notes.append(f"exported the adapter of checkpoint step {step}, not the run's final adapter")
