"""What a run of an MoE model gets, part by part: its row of the family table (`hone.core.speed.moe.families`) and what
is read from the model itself.

`describe(model)` finds the experts modules Hone's backends take over (3-D weights behind transformers'
`ExpertsInterface`), checks the router against the fused router, notes shared experts and leading dense layers,
and whether packed rows stay apart in every layer. `FamilyReport.lines()` is what the run's first lines show.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from torch import nn

from hone.core.speed.attention import packing_blocker
from hone.core.speed.moe.experts import find_experts, unsupported_reason
from hone.core.speed.moe.families import FAMILIES, Family


@dataclass
class FamilyReport:
    """What a run of this model gets, family by part.

    Attributes:
        model_type: the config's model type; family: its `FAMILIES` row (None: a family Hone has no row for).
        experts: what runs the experts; router: which router runs, and why; shared: shared experts and leading
        dense layers; attention: the attention path; plain: what stays on transformers' path.
        packing_blocker: why packed rows would attend across sequences in this model (None: packing is safe).
    """

    model_type: str
    family: Family | None
    experts: str
    router: str
    shared: str = ""
    attention: str = ""
    plain: list[str] = field(default_factory=list)
    packing_blocker: str | None = None

    def lines(self) -> list[str]:
        name = self.family.name if self.family else self.model_type
        out = [f"{name} ({self.model_type})", f"experts: {self.experts}", f"router: {self.router}"]
        if self.shared:
            out.append(self.shared)
        if self.attention:
            out.append(f"attention: {self.attention}")
        out += [f"on transformers' path: {item}" for item in self.plain]
        out.append("GGUF export: not for MoE models yet (export `merged`, then llama.cpp's convert_hf_to_gguf.py)")
        return out


def _configs(model: nn.Module):
    """(the model's config, its language model's config): a vision-language model's text config is its own type."""
    config = model.get_base_model().config if hasattr(model, "get_base_model") else model.config
    return config, (config.get_text_config() if hasattr(config, "get_text_config") else config)


def _router_words(model: nn.Module) -> str:
    """Whether the fused router (softmax -> top-k, checked against the router class's own forward) takes it."""
    from hone.core.speed.moe.fused_router import _class_forward_matches, _router_fields

    for name, module in model.named_modules():
        if not name.endswith((".gate", ".router")) or not hasattr(module, "top_k"):
            continue
        base = getattr(module, "base_layer", module)
        fields = _router_fields(base)
        if fields is not None and _class_forward_matches(base, *fields):
            return "Hone's fused router when it has LoRA (LoRA linear + one softmax/top-k kernel each way)"
        return (
            f"transformers' {type(base).__name__} (its routing is not the softmax -> top-k the fused router "
            "computes); its LoRA runs through peft"
        )
    return "transformers' router"


def _shared_words(model: nn.Module, config) -> str:
    parts = []
    if any(n.rsplit(".", 1)[-1] in ("shared_expert", "shared_experts", "shared_mlp") for n, _ in model.named_modules()):
        parts.append(
            "shared experts run as dense MLPs (fused LoRA linears where they have LoRA; the run's LoRA "
            "line says where peft left them without)"
        )
    dense = next(
        (
            int(v)
            for v in (
                getattr(config, a, None) for a in ("first_k_dense_replace", "num_dense_layers", "moe_layer_start_index")
            )
            if v
        ),
        0,
    )
    if dense:
        parts.append(f"the first {dense} layer{'s' if dense > 1 else ''} dense (the dense kernels)")
    return "; ".join(parts)


def describe(model: nn.Module) -> FamilyReport | None:
    """The family report of an MoE model (None for a dense model)."""
    experts = find_experts(model)
    outer, config = _configs(model)
    model_type = getattr(outer, "model_type", type(model).__name__)
    if not experts and not any(
        type(m).__name__.endswith(("Experts", "MoE", "SparseMoeBlock")) for m in model.modules()
    ):
        return None
    family = FAMILIES.get(model_type)
    reasons = sorted({r for _, m in experts if (r := unsupported_reason(m))})
    if not experts:
        experts_words = (
            "transformers' own experts: they are not 3-D weights behind ExpertsInterface, so Hone's "
            "grouped GEMMs and split expert LoRA do not apply"
        )
    elif reasons:
        experts_words = f"transformers' own experts ({'; '.join(reasons)})"
    else:
        experts_words = (
            f"{len(experts)} experts layers through Hone's grouped GEMMs (grouped_mm, Triton or torch; "
            "speed.moe_backend), expert LoRA as (X A) B per expert, never W + BA"
        )
    plain = [family.plain] if family and family.plain else []
    if family is None:
        plain.append(f"no family row for {model_type}: only what is checked on the model itself is known")
    return FamilyReport(
        model_type,
        family,
        experts_words,
        _router_words(model),
        _shared_words(model, config),
        family.attention if family else "",
        plain,
        packing_blocker(model),
    )
