"""Apply Hone's fused kernels to a loaded (peft) model, and take them off again.

`apply_kernels(model)` swaps fused versions into module instances (never classes, never module globals): norms,
the middle residual add, rope, gated MLPs, peft LoRA linears and Qwen-style MoE routers. It returns a
`KernelReport` of what was replaced and what was skipped and why; `revert_kernels(model)` restores every original
module and forward. The one thing to know: a module is replaced only where a probe of its output or a check of its
forward's code shows the fused version computes the same function; anything else keeps transformers' code.
"""

from __future__ import annotations

import inspect
import warnings
import weakref
from dataclasses import dataclass, field

import torch

from hone.core.speed.checkpointing.tiled_mlp import enable_tiling, forward_tile_for, mlp_in_pieces, tile_for, tiled_mlp
from hone.core.speed.fused.lora_layers import lora_base_kind, patch_lora_layer
from hone.core.speed.fused.patching import (
    Undo,
    UnsupportedForward,
    innermost,
    replace_child,
    replace_innermost,
    swap_forward,
    with_globals,
)
from hone.core.speed.moe.fused_router import patch_router, router_reason

# transformers model type -> the family it is reported as; the norm, rope, MLP and decoder patches run on these types
# only. For the MoE families (Qwen2-MoE, Qwen3-MoE, Mixtral) that covers the attention, norms and residual adds (and
# Qwen2-MoE's shared expert): expert layers are left to the MoE backends (`hone.core.speed.moe`). Any other model
# type gets only its peft LoRA layers and routers fused.
FAMILIES = {
    "llama": "llama",
    "mistral": "mistral",
    "qwen2": "qwen2",
    "qwen3": "qwen3",
    "gemma": "gemma",
    "gemma2": "gemma",
    "gemma3": "gemma",
    "gemma3_text": "gemma",
    "qwen2_moe": "qwen2-moe",
    "qwen3_moe": "qwen3-moe",
    "mixtral": "mixtral",
    # Qwen-VL: the language model's (and the image encoder's) norms and gated MLPs, the decoder adds; rope where
    # the attention calls the plain `apply_rotary_pos_emb` (the 3-D positions are folded into cos/sin before it)
    "qwen2_5_vl_text": "qwen2.5-vl",
    "qwen3_vl_text": "qwen3-vl",
    "qwen3_vl_moe_text": "qwen3-vl-moe",
    # MoE families with pre-norm decoder layers: norms (MLA's q/kv norms too), the middle add, first dense layers
    # and shared experts. Multi-head latent attention (no k_proj) keeps transformers' rope.
    "glm4_moe": "glm-4.5",
    "glm4_moe_lite": "glm-4.7-flash",
    "deepseek_v3": "deepseek-v3",
    "olmoe": "olmoe",
    "ernie4_5_moe": "ernie-4.5-moe",
    "minimax_m2": "minimax-m2",
    # gpt-oss: its norms and the middle add (its MLP returns the router scores beside the output); its rope rotates
    # with half-width cos/sin under another signature, so its attention keeps transformers' rope
    "gpt_oss": "gpt-oss",
}
_ROPE_PARAMETERS = ["q", "k", "cos", "sin", "unsqueeze_dim"]
_GLU_MLP_NAMES = {"down_proj", "act_fn", "gate_proj", "up_proj"}
_PRENORM_DECODER_NAMES = {"input_layernorm", "self_attn", "post_attention_layernorm", "mlp"}

_APPLIED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> (KernelReport, [Undo])
# Rebuilt forwards, one per (kind, class, variant): every layer of a model binds the same function object, so a
# compiled decoder block traced once is reused by all layers (dynamo guards on the functions a frame calls).
_FORWARDS: dict[tuple, object] = {}


def _shared_forward(key: tuple, build):
    if key not in _FORWARDS:
        _FORWARDS[key] = build()
    return _FORWARDS[key]


@dataclass
class KernelReport:
    """What `apply_kernels` did to one model.

    Attributes:
        model_type: the transformers model type (e.g. "qwen3").
        family: the supported family it belongs to, or None (then only LoRA layers are fused).
        backend: "triton" (CUDA), "triton-interpreter" (CPU with TRITON_INTERPRET=1) or "torch" (references).
        patched: kind -> count: rms_norm, add_rms_norm, rope, glu:<activation>, lora_linear, qlora_linear, router,
            tiled_mlp.
        skipped: reason -> names of the modules left as they were.
    """

    model_type: str
    family: str | None
    backend: str
    patched: dict[str, int] = field(default_factory=dict)
    skipped: dict[str, list[str]] = field(default_factory=dict)

    def count(self, kind: str) -> int:
        return self.patched.get(kind, 0)

    def summary(self) -> str:
        """One line for the run's events, e.g. "qwen3 (triton): rms_norm x9, rope x2, ...; skipped 1"."""
        done = ", ".join(f"{kind} x{n}" for kind, n in sorted(self.patched.items())) or "nothing"
        skipped = sum(len(names) for names in self.skipped.values())
        head = f"{self.family or self.model_type} ({self.backend}): {done}"
        return f"{head}; skipped {skipped} ({'; '.join(self.skipped)})" if skipped else head

    def to_dict(self) -> dict:
        return {
            "model_type": self.model_type,
            "family": self.family,
            "backend": self.backend,
            "patched": dict(self.patched),
            "skipped": {k: list(v) for k, v in self.skipped.items()},
        }

    def _add(self, kind: str) -> None:
        self.patched[kind] = self.patched.get(kind, 0) + 1

    def _skip(self, reason: str, name: str) -> None:
        self.skipped.setdefault(reason, []).append(name)


def apply_kernels(model: torch.nn.Module, *, tile_mlp: bool = False) -> KernelReport:
    """Swap in the fused kernels on `model` (a transformers model, or a peft model around one).

    What is replaced, each change undoable by `revert_kernels`:
    - RMSNorm modules (decoder norms, final norm, Qwen3/Gemma3 q/k norms) -> `FusedRMSNorm`, sharing the weight
      Parameter, after a probe shows which weight style ("llama" or "gemma") reproduces the module's output;
    - decoder layers of the pre-norm shape (`x + attn(norm(x))`, then `+ mlp(norm(.))`) -> the middle residual add
      fused into the post-attention norm (`add_rms_norm`);
    - attention modules -> their own forward, with `apply_rotary_pos_emb` resolved to the in-place Triton rope;
    - gated MLPs (`down(act(gate(x)) * up(x))`, also Qwen2-MoE's shared expert) -> the SwiGLU / GeGLU kernel,
      after a probe shows which activation `act_fn` computes;
    - peft LoRA linear layers (any model family) -> one autograd node for base + scaled B(A x), dense or nf4 base
      (`hone.core.speed.fused.lora_layers`);
    - peft-wrapped Qwen-style MoE routers (softmax -> top-k) -> that LoRA linear for the logits and one kernel for
      the top-k each way (`hone.core.speed.moe.fused_router`).
    The norm, rope, MLP and decoder patches apply to the model types in `FAMILIES`. On the CPU (without
    `TRITON_INTERPRET=1`) and inside `torch.compile` the patched modules run plain torch.

    Args:
        tile_mlp: also back-propagate the MLPs of pre-norm decoder layers in token tiles when Hone's checkpointer
            recomputes them (less memory, same work; `hone.core.speed.checkpointing.tiled_mlp`).

    Applying twice returns the first report and changes nothing more.
    """
    if model in _APPLIED:
        return _APPLIED[model][0]
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    model_type = _model_type(base)
    report = KernelReport(model_type=model_type, family=FAMILIES.get(model_type), backend=_backend(model))
    undos: list[Undo] = []
    try:
        if report.family is None:
            report._skip(f"model type {model_type!r} is not one of {sorted(FAMILIES)} (LoRA layers only)", "*")
        else:
            _patch_family(base, report, undos, tile_mlp)
        _patch_lora(model, report, undos)
    except Exception:
        for undo in reversed(undos):
            undo()
        raise
    _APPLIED[model] = (report, undos)
    return report


def revert_kernels(model: torch.nn.Module) -> int:
    """Restore every module and forward `apply_kernels` changed on `model`; returns how many were restored.

    A swap that something else has since replaced again is left alone (and named in a warning).
    """
    entry = _APPLIED.pop(model, None)
    if entry is None:
        return 0
    restored, stuck = 0, []
    for undo in reversed(entry[1]):
        if undo():
            restored += 1
        else:
            stuck.append(undo.label)
    if stuck:
        warnings.warn(
            f"revert_kernels: {len(stuck)} modules were replaced again after apply_kernels and were left "
            f"as they are: {', '.join(stuck[:5])}",
            stacklevel=2,
        )
    return restored


def kernels_applied(model: torch.nn.Module) -> KernelReport | None:
    """The report of the kernels currently applied to `model`, or None."""
    entry = _APPLIED.get(model)
    return entry[0] if entry else None


def _model_type(model: torch.nn.Module) -> str:
    config = getattr(model, "config", None)
    if config is None:
        return type(model).__name__
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    return getattr(text, "model_type", None) or getattr(config, "model_type", "") or type(model).__name__


def _backend(model: torch.nn.Module) -> str:
    from hone.kernels._runtime import HAS_TRITON, interpreting

    param = next(model.parameters(), None)
    device = param.device.type if param is not None else "cpu"
    if HAS_TRITON and device == "cuda":
        return "triton"
    if HAS_TRITON and device == "cpu" and interpreting():
        return "triton-interpreter"
    return "torch"


# ---- family patches -------------------------------------------------------------------------------------------


def _patch_family(base: torch.nn.Module, report: KernelReport, undos: list[Undo], tile_mlp: bool) -> None:
    from hone.kernels.rms_norm import FusedRMSNorm

    modules = dict(base.named_modules())
    # Norms first: the fused decoder forward reads its post-attention norm's weight and style.
    for name, module in modules.items():
        if type(module).__name__.endswith("RMSNorm") and not isinstance(module, FusedRMSNorm):
            _patch_norm(base, name, module, report, undos)
    for name, module in modules.items():
        if _has(module, "q_proj", "k_proj", "o_proj"):
            _patch_attention(name, module, report, undos)
        if _has(module, "gate_proj", "up_proj", "down_proj", "act_fn"):
            _patch_mlp(name, module, report, undos)
        if _has(module, *_PRENORM_DECODER_NAMES):
            _patch_decoder(name, module, report, undos, tile_mlp)


def _has(module: torch.nn.Module, *names: str) -> bool:
    return all(hasattr(module, n) for n in names)


def _patch_norm(base, name: str, module: torch.nn.Module, report: KernelReport, undos: list[Undo]) -> None:
    from hone.kernels.rms_norm import FusedRMSNorm

    parent_name, _, child = name.rpartition(".")
    parent = base.get_submodule(parent_name) if parent_name else base
    weight = getattr(module, "weight", None)
    eps = getattr(module, "variance_epsilon", getattr(module, "eps", None))
    if type(parent).__module__.startswith("peft.") or child not in parent._modules:
        report._skip("norm held by a peft wrapper (trained norm)", name)
    elif module._forward_hooks or module._forward_pre_hooks or getattr(module, "_hf_hook", None) is not None:
        report._skip("norm has hooks (e.g. accelerate offloading), which a replacement would drop", name)
    elif not isinstance(weight, torch.nn.Parameter) or weight.dim() != 1 or eps is None:
        report._skip("RMSNorm without a 1-D weight and eps", name)
    elif (style := _probe_norm_style(module, weight, float(eps))) is None:
        report._skip("RMSNorm whose output matches neither weight style", name)
    else:
        undos.append(replace_child(parent, child, FusedRMSNorm(weight, float(eps), style), name))
        report._add("rms_norm")


@torch.no_grad()
def _probe_norm_style(module: torch.nn.Module, weight: torch.Tensor, eps: float) -> str | None:
    """Which reference style reproduces `module` on a small random input (the two differ by 1 x the input)."""
    from hone.kernels.reference import NORM_STYLES, rms_norm_reference

    generator = torch.Generator().manual_seed(0)
    x = torch.randn(4, weight.shape[0], generator=generator).to(device=weight.device, dtype=weight.dtype)
    expected = module(x).float()
    tol = 1e-5 if weight.dtype == torch.float32 else 2e-2
    for style in NORM_STYLES:
        got = rms_norm_reference(x, weight, eps, style).float()
        if got.shape == expected.shape and torch.allclose(got, expected, rtol=tol, atol=tol):
            return style
    return None


def _patch_attention(name: str, module: torch.nn.Module, report: KernelReport, undos: list[Undo]) -> None:
    from hone.kernels.rope import apply_rotary  # same signature as transformers' apply_rotary_pos_emb

    cls = type(module)
    try:
        inner = innermost(cls.forward)
        original = inner.__globals__.get("apply_rotary_pos_emb")
        if original is None or "apply_rotary_pos_emb" not in inner.__code__.co_names:
            raise UnsupportedForward("forward does not call apply_rotary_pos_emb")
        # With the `kernels` package installed, transformers >= 5.25 wraps it in a module (a place for a Hub kernel)
        # whose forward is the function.
        plain = original.forward if isinstance(original, torch.nn.Module) else original
        if list(inspect.signature(plain).parameters) != _ROPE_PARAMETERS:
            raise UnsupportedForward("apply_rotary_pos_emb takes other arguments than (q, k, cos, sin, unsqueeze_dim)")
        _probe_rope(original)
        forward = _shared_forward(
            ("rope", cls),
            lambda: replace_innermost(cls.forward, lambda fn: with_globals(fn, {"apply_rotary_pos_emb": apply_rotary})),
        )
    except UnsupportedForward as exc:
        report._skip(f"attention: {exc}", name)
        return
    if "forward" in module.__dict__:
        report._skip("attention forward already replaced by another speed path", name)
        return
    undos.append(swap_forward(module, forward, name))
    report._add("rope")


@torch.no_grad()
def _probe_rope(original) -> None:
    """Raise UnsupportedForward unless `original` rotates like the rope kernel: half-split pairs over the whole head.
    Same signature is not enough: ERNIE's rotates interleaved pairs, GLM-4.5's only the first part of each head."""
    from hone.kernels.reference import rope_reference

    generator = torch.Generator().manual_seed(0)
    q, k = torch.randn(1, 2, 3, 8, generator=generator), torch.randn(1, 1, 3, 8, generator=generator)
    angles = torch.randn(1, 3, 4, generator=generator)
    cos, sin = angles.cos().repeat(1, 1, 2), angles.sin().repeat(1, 1, 2)
    try:
        got = original(q.clone(), k.clone(), cos, sin, 1)
    except Exception as exc:
        raise UnsupportedForward(f"apply_rotary_pos_emb failed on a probe ({type(exc).__name__})") from exc
    expected = rope_reference(q, k, cos, sin)
    if not all(torch.allclose(g, e, atol=1e-5) for g, e in zip(got, expected, strict=True)):
        raise UnsupportedForward("apply_rotary_pos_emb rotates other pairs than the rope kernel (half-split)")
    try:
        original(q.clone(), k.clone(), cos[..., :2].repeat(1, 1, 2), sin[..., :2].repeat(1, 1, 2), 1)
    except Exception:
        return  # like the kernel, it takes cos/sin as wide as the head only
    raise UnsupportedForward(
        "apply_rotary_pos_emb rotates part of each head (partial rotary); the rope kernel rotates all of it"
    )


def _patch_mlp(name: str, module: torch.nn.Module, report: KernelReport, undos: list[Undo]) -> None:
    from hone.kernels.glu import glu

    try:
        names = set(innermost(type(module).forward).__code__.co_names)
    except UnsupportedForward as exc:
        report._skip(f"mlp: {exc}", name)
        return
    if names != _GLU_MLP_NAMES:
        report._skip("mlp forward is not down_proj(act_fn(gate_proj(x)) * up_proj(x))", name)
        return
    activation = _probe_activation(module.act_fn)
    if activation is None:
        report._skip(f"mlp activation {type(module.act_fn).__name__} is not silu or gelu", name)
        return
    if "forward" in module.__dict__:
        report._skip("mlp forward already replaced by another speed path", name)
        return

    def build():
        def glu_mlp_forward(self, x):
            return self.down_proj(glu(self.gate_proj(x), self.up_proj(x), activation))

        return replace_innermost(type(module).forward, lambda fn: glu_mlp_forward)

    undos.append(swap_forward(module, _shared_forward(("glu", type(module), activation), build), name))
    report._add(f"glu:{activation}")


@torch.no_grad()
def _probe_activation(act_fn) -> str | None:
    from hone.kernels.reference import GLU_ACTIVATIONS, activation_reference

    if not callable(act_fn) or (isinstance(act_fn, torch.nn.Module) and any(True for _ in act_fn.parameters())):
        return None
    x = torch.linspace(-8.0, 8.0, 257)
    try:
        y = act_fn(x)
    except Exception:
        return None
    for activation in GLU_ACTIVATIONS:
        if torch.allclose(y, activation_reference(x, activation), rtol=1e-5, atol=1e-5):
            return activation
    return None


def _patch_decoder(name: str, module: torch.nn.Module, report: KernelReport, undos: list[Undo], tile_mlp: bool) -> None:
    from hone.kernels.rms_norm import FusedRMSNorm, add_rms_norm

    try:
        names = set(innermost(type(module).forward).__code__.co_names)
    except UnsupportedForward as exc:
        report._skip(f"decoder: {exc}", name)
        return
    if names != _PRENORM_DECODER_NAMES:
        return  # other shapes (Gemma 2/3's sandwich norms) keep their own forward; their norms are still fused
    if not isinstance(module.post_attention_layernorm, FusedRMSNorm):
        report._skip("decoder: post-attention norm was not replaced", name)
        return
    if "forward" in module.__dict__:
        report._skip("decoder forward already replaced by another speed path", name)
        return

    def make_forward(original):
        def prenorm_decoder_forward(self, hidden_states, *args, **kwargs):
            if args:
                return original(self, hidden_states, *args, **kwargs)
            attn_out = self.self_attn(hidden_states=self.input_layernorm(hidden_states), **kwargs)[0]
            norm = self.post_attention_layernorm
            if isinstance(norm, FusedRMSNorm):
                residual, hidden_states = add_rms_norm(hidden_states, attn_out, norm.weight, norm.eps, norm.style)
            else:
                residual = hidden_states + attn_out
                hidden_states = norm(residual)
            tile = tile_for(self, hidden_states)
            if tile is not None:  # a checkpointed recompute: the MLP is back-propagated tile by tile instead
                return residual + tiled_mlp(self, hidden_states, tile)
            tile = forward_tile_for(self, hidden_states)
            if tile is not None:  # no autograd (a checkpointed forward): the MLP runs a tile at a time
                return residual + mlp_in_pieces(self.mlp, hidden_states, tile)
            out = self.mlp(hidden_states)
            # an MoE block that returns its router scores too (gpt-oss): the decoder keeps the output only
            return residual + (out[0] if isinstance(out, tuple) else out)

        return prenorm_decoder_forward

    try:
        forward = _shared_forward(
            ("decoder", type(module)), lambda: replace_innermost(type(module).forward, make_forward)
        )
    except UnsupportedForward as exc:
        report._skip(f"decoder: {exc}", name)
        return
    undos.append(swap_forward(module, forward, name))
    report._add("add_rms_norm")
    if tile_mlp:
        tiling = enable_tiling(module, name)
        if isinstance(tiling, str):
            report._skip(f"tiled MLP: {tiling}", name)
        else:
            undos.append(tiling)
            report._add("tiled_mlp")


def _patch_lora(model: torch.nn.Module, report: KernelReport, undos: list[Undo]) -> None:
    for name, module in model.named_modules():
        if not (type(module).__module__.startswith("peft.tuners.lora") and hasattr(module, "lora_A")):
            continue
        if router_reason(module) is None:
            undos.append(patch_router(module, name))
            report._add("router")
            continue
        kind, why = lora_base_kind(module)
        if kind is None:
            report._skip(f"lora: {why}", name)
        elif "forward" in module.__dict__:
            report._skip("lora forward already replaced by another speed path", name)
        else:
            undos.append(patch_lora_layer(module, name))
            report._add(kind)
