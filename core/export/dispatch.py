"""`export_run`: one entry point that parses the format and calls that format's exporter."""

from __future__ import annotations

from pathlib import Path

from hone.core.export.formats import ExportResult, parse_format
from hone.core.export.source import Progress


def export_run(
    run_dir: str | Path,
    fmt: str,
    out: str | Path | None = None,
    *,
    force: bool = False,
    progress: Progress | None = None,
) -> ExportResult:
    """Export a run in one format and read the result back.

    Args:
        run_dir: the run folder (config.toml + adapter/).
        fmt: "adapter", "merged[:bf16|f16]", "gguf[:TYPE]", "gguf-lora[:f32|f16|bf16]" or "ollama[:TYPE]"
            (TYPE: see GGUF_TYPES; default q8_0).
        out: output folder; default RUN_DIR/exports/<format>[-type].
        force: replace an output folder an earlier export wrote (never a folder it did not write).
        progress: called as progress(stage description, overall fraction 0..1), from the exporting thread. To
            cancel, raise from it: the half-written output folder is removed and the exception propagates.

    Returns:
        ExportResult; `passed` is False when a read-back check failed (the files stay for inspection).

    Raises:
        ExportError: unknown format or type, unsupported model, run without adapter, output folder in the way.
    """
    spec = parse_format(fmt)
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
