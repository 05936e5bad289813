"""Each run setting's rule on resume (`ON_RESUME`: safe, schedule, update, eval or refused, and why), and the
settings that differ between two configs (`config_changes`).

resume_checks.py applies the rules; the module docstring there says what each kind does.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any

from hone.core.config import SECTIONS

KINDS = ("safe", "schedule", "update", "eval", "refused")


@dataclass(frozen=True)
class Rule:
    """What a resume does when a setting differs from the checkpoint's: `kind` (one of KINDS) and why."""

    kind: str
    why: str


_MODEL = Rule("refused", "it is the base model the adapter's weights belong to")
_DTYPE = Rule("refused", "the optimizer and loss-scaler state were saved for the weights' old dtype")
_ADAPTER = Rule(
    "refused",
    "it changes the adapter or what it trains; the checkpoint's weights and optimizer state are the old adapter's",
)
_ROWS = Rule(
    "refused",
    "it changes how rows become tokens, so the packs and the place in the data would no longer be the ones trained",
)
_ORDER = Rule(
    "refused", "it decides how rows are packed into steps, so the run would go on at another place in the data"
)
_FOLDER = Rule("refused", "it names a new run's folder; a resumed run stays in its own")
_SCHEDULE = Rule("schedule", "the learning-rate schedule, laid out anew from the next step")
_HOW = Rule("safe", "how steps run, not what they train")
_SAVING = Rule("safe", "how often the run evaluates or saves")

ON_RESUME: dict[str, Rule] = {
    "model.name_or_path": _MODEL,
    "model.gguf_file": _MODEL,
    "model.revision": _MODEL,
    "model.trust_remote_code": _MODEL,
    "model.dtype": _DTYPE,
    "data.train": Rule("refused", "it is the training data; a run on other data is a new run"),
    "data.eval": Rule("eval", "evaluation losses from here on are over other rows than before"),
    "data.eval_fraction": Rule("refused", "it moves rows between the training and the evaluation data"),
    "data.format": _ROWS,
    "data.columns": _ROWS,
    "data.max_length": _ROWS,
    "data.overlong": _ROWS,
    "data.train_on": _ROWS,
    "data.image_max_side": _ROWS,
    "data.chat_template": _ROWS,
    "data.allow_private_urls": Rule(
        "refused",
        "it decides which image rows are read, so the packs and the place in "
        "the data would no longer be the ones trained",
    ),
    **{f"lora.{f.name}": _ADAPTER for f in dataclasses.fields(SECTIONS["lora"])},
    "train.max_steps": _SCHEDULE,
    "train.epochs": _SCHEDULE,
    "train.lr": _SCHEDULE,
    "train.schedule": _SCHEDULE,
    "train.warmup_steps": _SCHEDULE,
    "train.warmup_ratio": _SCHEDULE,
    "train.batch_tokens": _ORDER,
    "train.grad_accum": _ORDER,
    "train.seed": Rule("refused", "it decides the data order (and the adapter's initialization)"),
    "train.optimizer": Rule("refused", "the checkpoint's optimizer state is the old optimizer's"),
    "train.fit_memory": _HOW,
    "train.parallel": _HOW,
    "train.method": Rule("refused", "it changes what the run optimizes and the rows it reads (pairs or single rows)"),
    **{
        f"preference.{f.name}": Rule("update", "the preference loss's settings")
        for f in dataclasses.fields(SECTIONS["preference"])
    },
    # GRPO: the group and answer length set each prompt's planned tokens (how rows are packed); the rest shape
    # sampling, rewards and the loss from the next step
    **{
        f"grpo.{f.name}": Rule("update", "GRPO's sampling, rewards and loss")
        for f in dataclasses.fields(SECTIONS["grpo"])
    },
    "grpo.num_generations": _ORDER,
    "grpo.max_completion_length": _ORDER,
    "grpo.num_iterations": _ORDER,  # how many times each step's packs come: the place in the data
    "train.max_grad_norm": Rule("update", "gradient clipping"),
    "train.weight_decay": Rule("update", "AdamW weight decay"),
    "train.eval_every": _SAVING,
    "train.sample_prompts": Rule("safe", "what the run answers at each evaluation, not what it trains"),
    "train.sample_max_new_tokens": Rule("safe", "what the run answers at each evaluation, not what it trains"),
    "train.eval_checkpoints": _SAVING,
    **{f"speed.{f.name}": _HOW for f in dataclasses.fields(SECTIONS["speed"])},
    "speed.packing": _ORDER,
    "output.runs_dir": _FOLDER,
    "output.name": _FOLDER,
    "output.checkpoint_every": _SAVING,
    "output.checkpoint_minutes": _SAVING,
    "output.keep_checkpoints": _SAVING,
    "output.report_to": _SAVING,
}
# A setting added to the config later is refused until it gets its own rule (a test asks for one per setting).
_UNKNOWN = Rule("refused", "it is not known to be safe to change in a resumed run")


def toml_value(value: Any) -> str:
    """A value as TOML writes it (and as --set reads it)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k} = {toml_value(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    return json.dumps(value, ensure_ascii=False)


@dataclass(frozen=True)
class Change:
    """One setting that differs from the checkpoint's: `key` as section.name, the values, and its rule."""

    key: str
    old: Any
    new: Any
    rule: Rule

    def __str__(self) -> str:
        return f"{self.key} {toml_value(self.old)} → {toml_value(self.new)}"


def config_changes(before: dict, after: dict) -> list[Change]:
    """The settings that differ between two `RunConfig.to_dict()`s, in the config's order."""
    changes = []
    for section in after:
        for name, new in after[section].items():
            old = before.get(section, {}).get(name, new)
            if old != new:
                key = f"{section}.{name}"
                changes.append(Change(key, old, new, ON_RESUME.get(key, _UNKNOWN)))
    return changes
