"""What `hone export` can write and what an export reports.

Stdlib only: the GUI's Export page imports this (to list formats and types) before torch is loaded.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from hone.core.errors import HoneError

SUPPORTED_FORMATS: dict[str, str] = {
    "adapter": "the LoRA adapter as a PEFT folder: weights, adapter_config.json, tokenizer with chat template, "
    "model card",
    "merged": "the LoRA merged into the base model: 16-bit safetensors shards with config and tokenizer "
    "(merged:bf16 or merged:f16)",
    "gguf": "the merged model as one GGUF file for llama.cpp, LM Studio and Ollama (gguf:TYPE, default q8_0)",
    "gguf-lora": "the adapter alone as a GGUF LoRA file in llama.cpp's layout (use it with --lora on a GGUF "
    "of the base model)",
    "ollama": "a GGUF of the merged model plus an Ollama Modelfile with chat template, stop tokens and "
    "parameters (ollama:TYPE, default q8_0)",
}

# GGUF weight types the `gguf` package writes correctly (its own quantizers). 1-D tensors (norms, biases) are
# always stored as f32, as llama.cpp does.
GGUF_TYPES: dict[str, str] = {
    "f32": "32-bit float: exact, 4 bytes per weight",
    "f16": "16-bit float: practically exact, 2 bytes per weight",
    "bf16": "bfloat16: the range of f32 at 2 bytes per weight, a little less precise than f16",
    "q8_0": "8-bit blocks of 32: about 1.06 bytes per weight, near-lossless (the default)",
    "q5_1": "5-bit blocks with offset: about 0.75 bytes per weight",
    "q5_0": "5-bit blocks: about 0.69 bytes per weight",
    "q4_1": "4-bit blocks with offset: about 0.63 bytes per weight",
    "q4_0": "4-bit blocks: about 0.56 bytes per weight, the smallest and the least precise",
}
DEFAULT_GGUF_TYPE = "q8_0"
# The type a format exports with when none is named, where that is not the first of FORMAT_TYPES[format].
DEFAULT_TYPES = {"gguf": DEFAULT_GGUF_TYPE, "ollama": DEFAULT_GGUF_TYPE}
# K-quants and i-quants have no quantizer in the `gguf` package; llama.cpp's own tool makes them from an f16 file.
K_QUANT_ADVICE = (
    "K-quants (q4_k_m, q5_k_m, q6_k, ...) need llama.cpp's quantizer: export gguf:f16, then run "
    "`llama-quantize model-f16.gguf model-q4_k_m.gguf Q4_K_M`"
)

MERGED_TYPES: dict[str, str] = {
    "bf16": "bfloat16 safetensors (the default when the base model does not say otherwise)",
    "f16": "float16 safetensors",
}
GGUF_LORA_TYPES: dict[str, str] = {
    "f32": "32-bit float (the default; LoRA matrices are small)",
    "f16": "16-bit float",
    "bf16": "bfloat16",
}

# format -> the types it accepts after a colon (an empty dict: none)
FORMAT_TYPES: dict[str, dict[str, str]] = {
    "adapter": {},
    "merged": MERGED_TYPES,
    "gguf": GGUF_TYPES,
    "gguf-lora": GGUF_LORA_TYPES,
    "ollama": GGUF_TYPES,
}

MANIFEST_FILE = "export.json"


class ExportError(HoneError):
    """An export cannot be done as asked: wrong format or type, unsupported model, missing adapter, output in
    the way."""


@dataclass(frozen=True)
class ExportSpec:
    """A parsed `--format` value: `gguf:q4_0` -> ExportSpec("gguf", "q4_0")."""

    format: str
    type: str | None = None

    @property
    def label(self) -> str:
        return f"{self.format}:{self.type}" if self.type else self.format

    @property
    def folder_name(self) -> str:
        """Default output folder name under RUN_DIR/exports."""
        return f"{self.format}-{self.type}" if self.type else self.format


def parse_format(text: str) -> ExportSpec:
    """Parse `adapter`, `merged[:bf16|f16]`, `gguf[:TYPE]`, `gguf-lora[:f32|f16|bf16]`, `ollama[:TYPE]`.

    Raises:
        ExportError: naming the supported formats or types.
    """
    name, _, kind = text.strip().lower().partition(":")
    if name not in SUPPORTED_FORMATS:
        raise ExportError(
            f"unknown export format {text!r}",
            f"choose one of: {', '.join(SUPPORTED_FORMATS)} (gguf and ollama take a type, e.g. gguf:q8_0)",
        )
    types = FORMAT_TYPES[name]
    if not kind:
        return ExportSpec(name, None)
    if not types:
        raise ExportError(f"format {name} takes no type (got {text!r})", f"write just --format {name}")
    if kind not in types:
        advice = f"{name} types are: {', '.join(types)}"
        if name in ("gguf", "ollama") and ("_k" in kind or kind.startswith("iq")):
            advice += f". {K_QUANT_ADVICE}"
        raise ExportError(f"{name} cannot be written as {kind!r}", advice)
    return ExportSpec(name, kind)


@dataclass
class ExportResult:
    """What one export wrote and how its read-back checks went.

    Attributes:
        path: the output folder.
        format: the format as given to export_run, with its type (e.g. "gguf:q8_0").
        files: every file written, inside `path`.
        checks: named numbers and verdicts, e.g. {"gguf.logits.max_rel_diff": 0.004,
            "gguf.logits.tolerance": 0.03, "gguf.tokenizer": "ok"}. Each compared number has its tolerance under
            the same name with ".tolerance" in place of the last part.
        passed: every check passed.
        failures: one sentence per failed check (empty when passed).
        step: the training step the exported adapter was saved at (None when its card does not say).
        notes: sentences to show besides the checks: the run was still training (so the export is of `step`, not
            of the training going on), staging folders of cut-short exports removed.
    """

    path: Path
    format: str
    files: list[Path]
    checks: dict[str, float | str]
    passed: bool
    failures: list[str] = field(default_factory=list)
    step: int | None = None
    notes: list[str] = field(default_factory=list)
