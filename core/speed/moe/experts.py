"""Hone's experts implementations, plugged into transformers through its `ExpertsInterface`.

transformers 5.x decorates each MoE experts class with `@use_experts_implementation`, whose forward dispatches on
`config._experts_implementation` to a function registered in `ExpertsInterface`. `register` adds `hone_grouped_mm`,
`hone_triton` and `hone_torch`, each running `hone.kernels.moe.experts.moe_experts` on one grouped-GEMM backend;
`apply_backend` / `revert_backend` switch a model between them with its own `set_experts_implementation`.
"""

from __future__ import annotations

import torch
from torch import nn

from hone.kernels.moe.backends import GroupedOps, make_ops
from hone.kernels.moe.clamped_glu import ClampedGlu, clamped_glu_reference
from hone.kernels.moe.experts import ExpertWeights, LoraFactors, moe_experts

# User-facing backend name -> experts implementation name in transformers' ExpertsInterface.
IMPLEMENTATIONS = {"grouped_mm": "hone_grouped_mm", "triton": "hone_triton", "torch": "hone_torch", "eager": "eager"}
HONE_IMPLEMENTATIONS = {impl: name for name, impl in IMPLEMENTATIONS.items() if impl.startswith("hone_")}
# Attribute a SplitLoraParamWrapper sets on the experts module for the duration of one call.
LORA_CALL_ATTR = "_hone_lora_call"
_PREVIOUS_ATTR = "_hone_previous_experts_implementation"

_ops_cache: dict[str, GroupedOps] = {}


def is_experts_module(module: nn.Module) -> bool:
    """A transformers experts module with stacked 3-D expert weights behind `ExpertsInterface`."""
    return (
        hasattr(module, "has_gate")
        and hasattr(module, "is_transposed")
        and hasattr(module, "num_experts")
        and isinstance(getattr(module, "down_proj", None), torch.Tensor)
        and module.down_proj.dim() == 3
    )


def find_experts(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """(name, module) of every experts module in the model (peft wrappers included in the walk)."""
    return [(name, m) for name, m in model.named_modules() if is_experts_module(m)]


def unsupported_reason(module: nn.Module) -> str | None:
    """Why Hone's path cannot run this experts module, or None when it can."""
    if getattr(module, "has_post_expert_norm", False):
        return "its experts apply a norm after each expert, which Hone's kernels do not implement"
    if getattr(module, "_is_expert_parallel", False):
        return "it is sharded for expert parallelism"
    return None


_SILU_HALVES_ATTR = "_hone_silu_halves"
# Set on an experts module by `set_fused_gate`: False keeps the activation on transformers' own code (autograd).
FUSED_GATE_ATTR = "_hone_fused_gate"


def set_fused_gate(model: nn.Module, enabled: bool) -> None:
    """Turn the fused gate activations (`hone.kernels.moe.glu`, `hone.kernels.moe.clamped_glu`) on or off for every
    experts module; they are on by default wherever the module's gate is silu on concatenated halves or gpt-oss's
    clamped GLU. The trainer follows `speed.kernels`."""
    for _, module in find_experts(model):
        setattr(module, FUSED_GATE_ATTR, bool(enabled))


def _is_silu_halves(module: nn.Module) -> bool:
    """Whether the module's gate is transformers' default `act_fn(gate) * up` on the halves of gate_up with a silu
    act_fn (checked once on a small CPU input, remembered on the module)."""
    cached = getattr(module, _SILU_HALVES_ATTR, None)
    if cached is not None:
        return cached
    result = False
    try:
        from transformers.integrations.moe import _default_apply_gate
    except ImportError:  # a transformers without the default gate: the generic path
        _default_apply_gate = None
    gate = getattr(type(module), "_apply_gate", None)
    if module.has_gate and _default_apply_gate is not None and gate is _default_apply_gate:
        with torch.no_grad():
            x = torch.linspace(-8.0, 8.0, 257)
            try:
                result = bool(torch.allclose(module.act_fn(x), torch.nn.functional.silu(x), rtol=1e-5, atol=1e-6))
            except Exception:  # an act_fn that cannot run on a CPU tensor: the generic path
                result = False
    setattr(module, _SILU_HALVES_ATTR, result)
    return result


_CLAMPED_GLU_ATTR = "_hone_clamped_glu"


def _clamped_glu(module: nn.Module) -> ClampedGlu | None:
    """gpt-oss's gate constants when the module's `_apply_gate` is its clamped GLU on interleaved columns (checked
    once against the fused form on a small CPU input that crosses both clamps, remembered on the module)."""
    cached = getattr(module, _CLAMPED_GLU_ATTR, False)
    if cached is not False:
        return cached
    result = None
    alpha, limit = getattr(module, "alpha", None), getattr(module, "limit", None)
    if module.has_gate and isinstance(alpha, (int, float)) and isinstance(limit, (int, float)) and limit > 0:
        gate = ClampedGlu(float(alpha), float(limit))
        with torch.no_grad():
            x = torch.linspace(-2.0 * limit, 2.0 * limit, 516).reshape(2, 258)
            try:
                if torch.allclose(module._apply_gate(x), clamped_glu_reference(x, gate), rtol=1e-5, atol=1e-5):
                    result = gate
            except Exception:  # a gate that cannot run on a CPU tensor: the generic path
                result = None
    setattr(module, _CLAMPED_GLU_ATTR, result)
    return result


def expert_weights(module: nn.Module) -> ExpertWeights:
    """The module's weights as (E, K, N) views (no copies).

    The module describes its layout through attributes the decorator sets: `has_gate` (gate_up_proj vs up_proj),
    `is_transposed` (gpt-oss stores (E, in, out)), `has_bias`, and its own `_apply_gate` (Qwen's silu(gate) * up on
    concatenated halves, gpt-oss's clamped GLU on interleaved columns) or `act_fn`.
    """

    def kn(w: torch.Tensor) -> torch.Tensor:
        return w if module.is_transposed else w.transpose(1, 2)

    if module.has_gate:
        up, up_bias, activation = module.gate_up_proj, "gate_up_proj_bias", module._apply_gate
    else:
        up, up_bias, activation = module.up_proj, "up_proj_bias", module.act_fn
    has_bias = getattr(module, "has_bias", False)
    fused = getattr(module, FUSED_GATE_ATTR, True)
    return ExpertWeights(
        up=kn(up),
        down=kn(module.down_proj),
        up_bias=getattr(module, up_bias) if has_bias else None,
        down_bias=module.down_proj_bias if has_bias else None,
        activation=activation,
        silu_halves=fused and _is_silu_halves(module),
        clamped_glu=_clamped_glu(module) if fused else None,
    )


def _ops(backend: str) -> GroupedOps:
    if backend not in _ops_cache:
        _ops_cache[backend] = make_ops(backend)
    return _ops_cache[backend]


def _routing_args(args: tuple, kwargs: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """(top_k_index, top_k_weights): every MoE block passes them positionally; gpt-oss names them differently."""
    index = args[0] if len(args) > 0 else kwargs.get("top_k_index", kwargs.get("router_indices"))
    weights = args[1] if len(args) > 1 else kwargs.get("top_k_weights", kwargs.get("routing_weights"))
    return index, weights


def _make_forward(backend: str):
    def experts_forward(self: nn.Module, hidden_states: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        top_k_index, top_k_weights = _routing_args(args, kwargs)
        if unsupported_reason(self) is not None:
            from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS

            return ALL_EXPERTS_FUNCTIONS["grouped_mm"](self, hidden_states, top_k_index, top_k_weights)
        lora: dict[str, LoraFactors] = getattr(self, LORA_CALL_ATTR, None) or {}
        from hone.core.speed.checkpointing.layer_recompute import is_recomputing

        # A graph built while Hone's checkpointing recomputes a layer is back-propagated once, right after.
        return moe_experts(
            hidden_states,
            top_k_index,
            top_k_weights,
            expert_weights(self),
            _ops(backend),
            lora_up=lora.get("up"),
            lora_down=lora.get("down"),
            training=self.training,
            single_use=is_recomputing(),
        )

    experts_forward.__name__ = f"hone_{backend}_experts_forward"
    experts_forward.__doc__ = f"Hone's experts layer on the `{backend}` grouped-GEMM backend (see hone.core.speed.moe)."
    return experts_forward


def register() -> None:
    """Register hone_grouped_mm / hone_triton / hone_torch in transformers' ExpertsInterface (idempotent).

    Each is a function `fn(module, hidden_states, top_k_index, top_k_weights)`, the signature `ExpertsInterface`
    calls (the same on transformers 5.17 and the latest 5.x).
    """
    from transformers.integrations.moe import ExpertsInterface

    for impl, backend in HONE_IMPLEMENTATIONS.items():
        ExpertsInterface.register(impl, _make_forward(backend))


def _transformers_model(model: nn.Module) -> nn.Module:
    get_base = getattr(model, "get_base_model", None)  # a peft model wraps the transformers model
    return get_base() if callable(get_base) else model


def current_implementation(model: nn.Module) -> str | None:
    """The experts implementation the model's experts dispatch to now."""
    experts = find_experts(model)
    config = getattr(experts[0][1], "config", None) if experts else None
    return getattr(config, "_experts_implementation", None)


def apply_backend(model: nn.Module, backend: str) -> str:
    """Switch every experts module to a backend ("grouped_mm", "triton", "torch", "eager"); `revert_backend`
    restores what was there before the first switch. Returns the implementation name now set."""
    register()
    target = _transformers_model(model)
    if not hasattr(target, _PREVIOUS_ATTR):
        setattr(target, _PREVIOUS_ATTR, current_implementation(target))
    impl = IMPLEMENTATIONS[backend]
    target.set_experts_implementation(impl)
    return impl


def revert_backend(model: nn.Module) -> None:
    """Undo `apply_backend`: the experts implementation the model had before."""
    target = _transformers_model(model)
    if hasattr(target, _PREVIOUS_ATTR):
        previous = getattr(target, _PREVIOUS_ATTR)
        delattr(target, _PREVIOUS_ATTR)
        if previous is not None:
            target.set_experts_implementation(previous)


def is_hone_active(module: nn.Module) -> bool:
    """Whether this experts module dispatches to one of Hone's implementations."""
    config = getattr(module, "config", None)
    return getattr(config, "_experts_implementation", None) in HONE_IMPLEMENTATIONS


register()
