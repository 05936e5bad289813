"""A causal LM seen as body + LM head: what the chunked loss (`hone.core.train.loss`) computes through, and what
the host tables (`hone.core.speed.host_tables`) check before moving the head to host memory.

`head_plan(model)` finds the body (the module giving hidden states), the output projection, and the logit
post-processing transformers applies after the head (a multiplier, a divisor, a tanh soft-cap). A model with any
other logit setting it does not know gets a string saying why, and its callers fall back to the model's own forward.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch only for the annotations: finding the split needs none
    from torch import nn

# Config attributes that mention logits but do not change the LM head's output.
_HARMLESS_LOGIT_ATTRS = frozenset(
    {
        "output_router_logits",
        "num_logits_to_keep",
        "attn_logit_softcapping",
        "router_logits",
        "logit_scale_init_value",
        "output_logits",
        "contrastive_logits_temperature",
    }
)
_HANDLED_LOGIT_ATTRS = frozenset({"final_logit_softcapping", "logit_scale", "logits_scaling", "output_multiplier"})


@dataclass(frozen=True)
class HeadPlan:
    """How to run a causal LM as body + head for the chunked loss.

    Attributes:
        body: module returning hidden states of shape (B, T, H) as its first output / `last_hidden_state`.
        head: the output projection (H -> V).
        scale: multiplier applied to the head's output (1.0 = none).
        softcap: tanh soft-cap `softcap * tanh(logits / softcap)` applied after the scale (None = none).
    """

    body: nn.Module
    head: nn.Module
    scale: float = 1.0
    softcap: float | None = None


def _configs(model) -> list:
    config = getattr(model, "config", None)
    if config is None:
        return []
    text = getattr(config, "text_config", None) if hasattr(config, "get_text_config") else None
    return [config] + ([text] if text is not None and text is not config else [])


def head_plan(model) -> HeadPlan | str:
    """Split a (possibly peft-wrapped) causal LM into body and head, or say why it cannot be done.

    Returns:
        A `HeadPlan`, or a string naming the reason the chunked loss falls back to the model's own forward.
    """
    hf = model.get_base_model() if hasattr(model, "get_base_model") else model
    prefix = getattr(hf, "base_model_prefix", "")
    body = getattr(hf, prefix, None) if prefix else None
    head = hf.get_output_embeddings() if hasattr(hf, "get_output_embeddings") else None
    if body is None or body is hf or head is None:
        return f"{type(hf).__name__} has no separate body and LM head"
    scale, softcap = 1.0, None
    for config in _configs(hf):
        for name, value in vars(config).items():
            if "logit" not in name and name != "output_multiplier":
                continue
            if name in _HARMLESS_LOGIT_ATTRS or value is None or isinstance(value, bool):
                continue
            if name not in _HANDLED_LOGIT_ATTRS:
                return f"unknown logit setting {name}={value!r} in {type(config).__name__}"
            if name in ("logit_scale", "output_multiplier"):
                scale *= float(value)
            elif name == "logits_scaling":
                scale /= float(value)
            elif name == "final_logit_softcapping":
                softcap = float(value)
    return HeadPlan(body=body, head=head, scale=scale, softcap=softcap)


__all__ = ["HeadPlan", "head_plan"]
