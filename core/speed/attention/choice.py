"""Choosing and installing the attention backend for packed rows, once per run.

`configure(model, speed_cfg, device)` picks a backend (`speed.attention`: auto, varlen, flash, sdpa, hf; `choose`
says when each is taken), registers its function with transformers' `AttentionInterface` and sets it on the
model; `revert(model, choice)` puts the model's previous attention back. The returned `Choice` says what was picked
and why, for RunStarted. The one thing to know: for Hone's registered names transformers builds no mask and runs
no packed-sequence detection (a host sync); the functions in `backends` read the batch's metadata from the kwargs.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, fields, replace

import torch

from hone.core.model_info import attention_head_dim
from hone.core.speed.attention import backends, linear_attention, vision_encoder
from hone.core.speed.attention.long_rows import LongRows
from hone.core.vision import host_merge

# Names registered with transformers' AttentionInterface. They avoid "flash" and "sdpa" on purpose: transformers
# switches on those substrings in a few places (e.g. `is_flash_attention_requested`).
IMPLEMENTATIONS = {
    "varlen": "hone_varlen",
    "flash": "hone_fa2",
    "sdpa": "hone_blockmask",
    "rows": "hone_rows",
}
_FUNCTIONS = {
    "hone_varlen": backends.varlen_attention,
    "hone_fa2": backends.fa2_attention,
    "hone_blockmask": backends.blockmask_attention,
    "hone_rows": backends.rows_attention,
}
PER_LAYER_SUFFIX = "_per_layer"


@dataclass(frozen=True)
class Choice:
    """The attention backend picked for a run.

    Attributes:
        name: "varlen", "flash", "rows", "sdpa" or "hf".
        reason: one sentence for the run log / RunStarted: why this backend.
        implementation: the name set as the model's attention implementation.
        previous: the model's attention implementation before `configure` (what `revert` restores).
        per_layer_metadata: True in the benchmark-only mode that rebuilds metadata in every layer.
        varlen: how the varlen kernel is called for this model (probed), None for the other backends.
        encoder_previous: a Qwen-VL image encoder's attention implementation before it was put on varlen too.
        host_merge: the vision model merges its images with hone.core.vision.host_merge (`revert` removes it).
    """

    name: str
    reason: str
    implementation: str
    previous: str
    per_layer_metadata: bool = False
    varlen: backends.VarlenOptions | None = None
    encoder_previous: str | None = None  # the image encoder's attention before (None: left as it was)
    host_merge: bool = False


def register() -> None:
    """Register Hone's attention functions (and their per-layer-metadata variants) with transformers.

    The names are not in transformers' `AttentionMaskInterface`, so transformers' mask creation returns at once
    for them: it builds no dense mask and never runs its packed-sequence detection (which calls `.all()` on a GPU
    tensor, a host sync, in transformers 5.17 and 5.24 alike).
    """
    from transformers import AttentionInterface

    for name, fn in _FUNCTIONS.items():
        AttentionInterface.register(name, fn)
        AttentionInterface.register(name + PER_LAYER_SUFFIX, backends.PER_LAYER_METADATA[fn])


def register_varlen(options: backends.VarlenOptions, per_layer_metadata: bool = False) -> str:
    """Register the varlen function bound to `options` under a name that spells them out; returns the name.

    The model's attention implementation is that name, so the options travel with the model (its config), not
    with this module: a base model and a fine-tune in one process each call the kernel their own way. Options as
    this torch's signature gives them keep the plain name (`register` binds the same function to it).
    """
    from transformers import AttentionInterface

    plain = backends.varlen_signature()
    name = IMPLEMENTATIONS["varlen"]
    for field in fields(options):
        value = getattr(options, field.name)
        if isinstance(value, LongRows):
            name += f"_{value.tag()}"
        elif value != getattr(plain, field.name):
            name += f"_{field.name}" if value else f"_no_{field.name}"
    fn = backends.varlen_attention
    if per_layer_metadata:
        name, fn = name + PER_LAYER_SUFFIX, backends.PER_LAYER_METADATA[fn]
    AttentionInterface.register(name, functools.partial(fn, options=options))
    return name


def current_implementation(model) -> str:
    """The attention of the model's language part (its text config's, on a vision-language model)."""
    text, _ = language_and_vision_configs(model)
    return text._attn_implementation


def language_and_vision_configs(model):
    """(the config whose attention Hone sets, the image encoder's config or None). A vision-language model's
    language model is its `text_config`; a text model is its own config."""
    config = _hf_model(model).config
    vision = getattr(config, "vision_config", None)
    text = getattr(config, "text_config", None) if vision is not None else None
    return (text, vision) if text is not None else (config, vision)


def _hf_model(model):
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def apply_attention(model, implementation: str) -> str:
    """Set `implementation` (a registered name, see `register` and `register_varlen`) as the model's attention;
    returns the previous one."""
    register()
    hf = _hf_model(model)
    previous = current_implementation(model)
    _set_language_attention(hf, implementation)
    if current_implementation(model) != implementation:
        raise RuntimeError(f"{type(hf).__name__} did not accept attention implementation {implementation!r}")
    return previous


def _set_language_attention(hf, implementation: str) -> None:
    """On a vision-language model only the language model's attention changes: the image encoder builds its own
    masks and sequence starts for transformers' attention."""
    text, vision = language_and_vision_configs(hf)
    hf.set_attn_implementation(
        {"text_config": implementation} if vision is not None and text is not hf.config else implementation
    )


def revert_attention(model, previous: str) -> None:
    """Put back the attention implementation `apply_attention` replaced."""
    _set_language_attention(_hf_model(model), previous)


def revert(model, choice: Choice) -> None:
    """Undo `configure`: the model gets back the attention it had before."""
    if choice.implementation != choice.previous:
        revert_attention(model, choice.previous)
    vision_encoder.revert_encoder_attention(_hf_model(model), choice.encoder_previous)
    if choice.host_merge:
        host_merge.uninstall(_hf_model(model))


def use_per_layer_metadata(model, choice: Choice) -> Choice:
    """Switch a configured model to the benchmark-only variant of its backend that rebuilds the metadata in every
    layer (what building it once per batch saves); returns the new Choice, which `revert` undoes as well."""
    if choice.name == "hf" or choice.per_layer_metadata:
        return choice
    if choice.varlen is not None:
        implementation = register_varlen(choice.varlen, per_layer_metadata=True)
    else:
        implementation = IMPLEMENTATIONS[choice.name] + PER_LAYER_SUFFIX
    apply_attention(model, implementation)
    return replace(
        choice,
        implementation=implementation,
        per_layer_metadata=True,
        reason=choice.reason + f"; metadata rebuilt in every layer ({implementation}, benchmark only)",
    )


# ---- what the model needs ----------------------------------------------------------------------------------------


def _unsupported_reason(model) -> str | None:
    """Why Hone's packed attention cannot serve this model, or None."""
    hf = _hf_model(model)
    config = hf.config
    if getattr(config, "vision_config", None) is not None:
        from hone.core.vision.families import PACKED, family_of

        family = family_of(hf)
        if family is None or family.batching != PACKED:
            return "vision-language model whose rows are padded, not packed (its attention masks are transformers')"
        if getattr(config, "text_config", None) is None:
            return "vision-language model without a separate language-model config"
    if _has_indexer(model):
        return (
            "its sparse-attention indexer (DeepSeek-V3.2) picks the keys each query sees through transformers' "
            "attention mask, which Hone's packed kernels do not build"
        )
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    if getattr(text, "attn_logit_softcapping", None):
        return "attention logit soft-capping (e.g. Gemma 2) is not supported by the packed kernels"
    if getattr(text, "attention_dropout", 0.0):
        return f"attention dropout {text.attention_dropout} is not supported by the packed kernels"
    return None


def _has_indexer(model) -> bool:
    """Attention whose sparse-attention indexer reads the 4-D mask transformers builds (DeepSeek-V3.2)."""
    return any(isinstance(getattr(module, "indexer", None), torch.nn.Module) for module in _hf_model(model).modules())


def _has_sinks(model) -> bool:
    """Attention with per-head sink logits (gpt-oss)."""
    return any(isinstance(getattr(module, "sinks", None), torch.Tensor) for module in _hf_model(model).modules())


def _model_dtype(model) -> torch.dtype:
    for p in _hf_model(model).parameters():
        if p.is_floating_point():
            return p.dtype
    return torch.float32


def _attention_shape(model) -> tuple[int, int, int, list[int | None]]:
    """(query heads, key/value heads, head dim, distinct sliding windows) of the text model."""
    config = _hf_model(model).config
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    heads = text.num_attention_heads
    kv_heads = getattr(text, "num_key_value_heads", None) or heads
    head_dim = attention_head_dim(text)
    window = getattr(text, "sliding_window", None)
    windows = [None] + ([int(window)] if window else [])
    return heads, kv_heads, head_dim, windows


def _value_dim(model) -> int | None:
    """v's head dim where it differs from q/k's (multi-head latent attention), else None."""
    config = _hf_model(model).config
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    value = getattr(text, "v_head_dim", None)
    return int(value) if value and value != _attention_shape(model)[2] else None


def packing_blocker(model) -> str | None:
    """Why packed rows would not stay apart in some layer of this model, else None.

    Hone's attention backends cover the attention layers; Gated DeltaNet layers are kept apart by
    `linear_attention` where this transformers version calls the functions it swaps.
    """
    return linear_attention.unsupported(_hf_model(model))


# ---- the varlen probe --------------------------------------------------------------------------------------------


def probe_varlen(
    device: torch.device,
    dtype: torch.dtype,
    heads: int,
    kv_heads: int,
    head_dim: int,
    windows: list[int | None],
    sinks: bool = False,
    value_dim: int | None = None,
) -> backends.VarlenOptions | str:
    """Run varlen attention once on the device (grouped heads, windows, backward) against a dense reference;
    with `sinks`, sink logits too, and every gradient (q, k, v, sinks) compared as well; with `value_dim`, values
    of that head dim (MLA).

    This syncs, but runs once per run, before training. Returns the options that passed (key/value heads
    expanded first if grouped heads fail), else the reason varlen cannot be used.
    """
    options = backends.varlen_signature()
    if any(w is not None for w in windows) and not options.window:
        return "this torch's varlen_attn has no sliding-window support"
    if sinks and not options.lse:
        return "this torch's varlen_attn cannot return the log-sum-exp that attention sinks need"
    failures = []
    for candidate in (options, replace(options, repeat_kv=True)):
        try:
            error = _varlen_error(device, dtype, heads, kv_heads, head_dim, windows, sinks, candidate, value_dim)
        except Exception as exc:  # a kernel that cannot run here: try the next way, then report
            error = f"{type(exc).__name__}: {exc}"
        if error is None:
            return candidate
        failures.append(error)
        if heads == kv_heads:
            break
    return "varlen_attn failed its check on this device (" + "; ".join(failures) + ")"


# Probe tolerance: bf16 attention outputs of unit-scale inputs agree with an fp32 reference to ~1e-2.
_PROBE_TOLERANCE = 5e-2


def sink_attention_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor,
    sinks: torch.Tensor | None,
    scale: float | None = None,
) -> torch.Tensor:
    """Dense attention in the inputs' dtype (`backends.dense_sink_attention`) for one row: (1, H, T, D)
    q, (1, Hkv, T, D) k / v, `block_causal_mask`'s (1, 1, T, T), optional (H,) sinks. Returns (T, H, D)."""
    return backends.dense_sink_attention(q, k, v, mask, sinks, scale)[0]


def _relative_error(got: torch.Tensor | None, want: torch.Tensor) -> float:
    if got is None or not torch.isfinite(got).all():
        return float("inf")
    return ((got.float() - want).abs().max() / want.abs().max().clamp_min(1e-6)).item()


def _varlen_error(
    device,
    dtype,
    heads,
    kv_heads,
    head_dim,
    windows,
    sinks: bool,
    options: backends.VarlenOptions,
    value_dim: int | None = None,
) -> str | None:
    generator = torch.Generator(device="cpu").manual_seed(0)
    lengths = [5, 11, 1, 8]
    total = sum(lengths)
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device=device)
    for window in windows:
        q, k, v = (
            torch.randn(1, h, total, dim, generator=generator).to(device, dtype).requires_grad_()
            for h, dim in ((heads, head_dim), (kv_heads, head_dim), (kv_heads, value_dim or head_dim))
        )
        sink = (torch.randn(heads, generator=generator) + 1.0).to(device, dtype).requires_grad_() if sinks else None
        out = backends._varlen(q, k, v, cu, max(lengths), None, window, sink, options=options)
        grad_out = torch.randn(out.shape, generator=generator).to(device)
        (out.float() * grad_out).sum().backward()
        mask = backends.block_causal_mask(cu, total, window)
        leaves = [t.detach().float().requires_grad_() for t in (q, k, v) + ((sink,) if sinks else ())]
        ref = sink_attention_reference(*leaves[:3], mask, leaves[3] if sinks else None)
        (ref * grad_out).sum().backward()
        errors = {"output": _relative_error(out.detach(), ref.detach())}
        if sinks:  # the sink path relies on the attention node's saved output: check every gradient
            errors |= {
                name: _relative_error(t.grad, ref_t.grad)
                for name, t, ref_t in zip(("dq", "dk", "dv", "d sinks"), (q, k, v, sink), leaves, strict=True)
            }
        elif k.grad is None or not torch.isfinite(k.grad).all():
            errors["dk"] = float("inf")
        bad = {name: f"{err:.3g}" for name, err in errors.items() if not err <= _PROBE_TOLERANCE}
        if bad:
            return f"window {window}{' with sinks' if sinks else ''}: relative errors {bad} against the dense reference"
    return None


# ---- long rows through cuDNN -------------------------------------------------------------------------------------

# The probe's own threshold and lengths: one long sequence whose bucket reaches into the next sequence's tokens, one
# whose bucket runs past the batch's end (zero rows), and short runs around them.
_PROBE_THRESHOLD = 200
_PROBE_LENGTHS = [37, 300, 5, 260, 9]


def probe_long_rows(
    device: torch.device,
    dtype: torch.dtype,
    heads: int,
    kv_heads: int,
    head_dim: int,
    varlen: backends.VarlenOptions,
    threshold: int,
) -> LongRows | str:
    """Run the long-row path once on the device (through `backends._varlen`, as a layer calls it) against a dense
    reference, output and the q, k, v gradients; returns the way of calling cuDNN that passed (grouped heads as
    they are or expanded, views or contiguous copies), else why the path cannot be used."""
    from hone.core.data.batch_lengths import register_batch

    candidates = [
        LongRows(threshold, gqa_flag, contiguous)
        for contiguous in (False, True)
        for gqa_flag in ((True, False) if heads != kv_heads else (True,))
    ]
    failures = []
    generator = torch.Generator(device="cpu").manual_seed(1)
    total = sum(_PROBE_LENGTHS)
    cu = torch.tensor([0, *torch.tensor(_PROBE_LENGTHS).cumsum(0).tolist()], dtype=torch.int32, device=device)
    register_batch(cu, _PROBE_LENGTHS)
    q, k, v = (
        torch.randn(1, h, total, head_dim, generator=generator).to(device, dtype) for h in (heads, kv_heads, kv_heads)
    )
    grad_out = torch.randn(total, heads, head_dim, generator=generator).to(device)
    leaves = [t.detach().float().requires_grad_() for t in (q, k, v)]
    ref = sink_attention_reference(*leaves, backends.block_causal_mask(cu, total), None)
    (ref * grad_out).sum().backward()
    for candidate in candidates:
        options = replace(varlen, long_rows=replace(candidate, threshold=_PROBE_THRESHOLD), grouped_backward=False)
        inputs = [t.detach().requires_grad_() for t in (q, k, v)]
        try:
            out = backends._varlen(*inputs, cu, max(_PROBE_LENGTHS), None, None, options=options)
            (out.float() * grad_out).sum().backward()
        except Exception as exc:  # a kernel that cannot run this way here: try the next way, then report
            failures.append(f"{candidate.tag()}: {type(exc).__name__}: {exc}")
            continue
        errors = {"output": _relative_error(out.detach(), ref.detach())}
        errors |= {
            name: _relative_error(t.grad, leaf.grad)
            for name, t, leaf in zip(("dq", "dk", "dv"), inputs, leaves, strict=True)
        }
        bad = {name: f"{err:.3g}" for name, err in errors.items() if not err <= _PROBE_TOLERANCE}
        if not bad:
            return candidate
        failures.append(f"{candidate.tag()}: relative errors {bad} against the dense reference")
    return "cuDNN attention failed its check on this device (" + "; ".join(failures) + ")"


def _long_rows(model, speed_cfg, device: torch.device, varlen: backends.VarlenOptions) -> tuple[LongRows | None, str]:
    """The long-row path for a varlen run (`speed.long_row_attention`), and a few words on the choice."""
    from hone.core.speed.attention.long_rows import KEEP_MEMORY_FRACTION, LONG_ROW_TOKENS

    setting = getattr(speed_cfg, "long_row_attention", "off")
    if setting == "off":
        return None, "long rows in the same varlen call (speed.long_row_attention = off)"
    if varlen.grouped_backward or _has_sinks(model):
        return None, ""
    if not torch.backends.cudnn.is_available():
        return None, "long rows in the same varlen call (cuDNN is not available)"
    major, minor = torch.cuda.get_device_capability(device)
    if setting == "auto" and major != 9:
        return None, (
            f"long rows in the same varlen call: auto sends them to cuDNN attention on Hopper GPUs, where "
            f"it was measured faster; this one is sm_{major}{minor} (speed.long_row_attention = on tries "
            "it)"
        )
    probed = probe_long_rows(device, _model_dtype(model), *_attention_shape(model)[:3], varlen, LONG_ROW_TOKENS)
    if isinstance(probed, str):
        return None, f"long rows in the same varlen call: {probed}"
    said = f"sequences of {probed.threshold:,} tokens or more through cuDNN attention, one call each"
    if getattr(speed_cfg, "keep_long_row_attention", False):
        probed = replace(probed, keep=True)
        said += (
            " (with checkpointing, kept from the forward for the backward while allocated memory, with room left "
            f"for the backward, stays under {KEEP_MEMORY_FRACTION:.0%} of what the process may allocate)"
        )
    return probed, said


# ---- the choice --------------------------------------------------------------------------------------------------


def choose(model, requested: str, device: torch.device | str) -> tuple[str, str, backends.VarlenOptions | None]:
    """Pick a backend name ("varlen", "flash", "sdpa", "hf"), the reason and, for varlen, the probed options,
    without touching the model.

    The backends, in the order `auto` tries them:
    - varlen: `torch.nn.attention.varlen.varlen_attn` on CUDA in bf16/fp16, when `probe_varlen` passes on the
      device (grouped heads and sliding windows against a dense reference).
    - flash: flash-attn's `flash_attn_varlen_func`, when that package is installed.
    - rows: SDPA on each packed row, no mask across the batch (the CPU under `auto`: memory grows with the rows'
      squared lengths, not the batch's; `sdpa` keeps the block mask there).
    - sdpa: SDPA with one block-diagonal causal mask per batch, shared across layers (older GPUs, fp32, sinks).
    - hf: transformers' own attention, untouched (it builds its mask from position_ids every forward).
    Models with attention sinks (gpt-oss) take varlen when its probe, gradients included, passes with sinks (see
    `backends.SinkRescale`), else the shared block mask with the sink attention computed densely; never
    transformers' own attention unless asked for: gpt-oss builds its masks without the position ids, so a packed
    row would attend across its sequences. Models with attention logit soft-capping (Gemma 2) or attention dropout
    keep transformers' attention, and so do vision-language models (`_unsupported_reason`) and, in `configure`,
    runs without packing; the reason says so.
    """
    device = torch.device(device)
    if requested == "hf":
        caveat = (
            (
                " (gpt-oss builds its masks without the position ids: packed sequences attend to each other; "
                "`auto` keeps them apart)"
            )
            if _has_sinks(model)
            else ""
        )
        return "hf", "speed.attention = hf: transformers' own attention" + caveat, None
    unsupported = _unsupported_reason(model)
    if unsupported:
        return "hf", f"transformers' attention: {unsupported}", None
    sinks = _has_sinks(model)
    on_cuda = device.type == "cuda"
    half = _model_dtype(model) in (torch.bfloat16, torch.float16)
    why_not: dict[str, str] = {}
    if requested in ("auto", "varlen"):
        if not on_cuda:
            why_not["varlen"] = "varlen needs a CUDA GPU"
        elif not half:
            why_not["varlen"] = f"varlen needs bf16/fp16 weights, the model is {_model_dtype(model)}"
        elif not backends.varlen_available():
            why_not["varlen"] = f"torch {torch.__version__} has no torch.nn.attention.varlen"
        else:
            probed = probe_varlen(
                device, _model_dtype(model), *_attention_shape(model), sinks=sinks, value_dim=_value_dim(model)
            )
            if isinstance(probed, backends.VarlenOptions):
                return (
                    "varlen",
                    (
                        "torch varlen_attn (flash kernel) with the batch's cu_seqlens, no mask"
                        + ("; sink logits applied from its log-sum-exp" if sinks else "")
                    ),
                    probed,
                )
            why_not["varlen"] = probed
    if requested in ("auto", "flash"):
        if sinks:
            why_not["flash"] = "flash-attn has no attention sinks"
        elif not on_cuda or not half:
            why_not["flash"] = "flash-attn needs a CUDA GPU and bf16/fp16 weights"
        elif not backends.fa2_available():
            why_not["flash"] = "the flash-attn package is not installed"
        else:
            return "flash", "flash-attn flash_attn_varlen_func with the batch's cu_seqlens, no mask", None
    detail = "; ".join(why_not.values())
    if requested == "auto" and not on_cuda and not sinks:
        return (
            "rows",
            ("SDPA on each packed row (CPU): attention memory grows with each row's length, not the batch's"),
            None,
        )
    reason = "SDPA with one block-diagonal causal mask per batch, shared by all layers"
    if sinks:
        reason = (
            "one block-diagonal causal mask per batch, shared by all layers, attention with sinks computed "
            "densely as transformers' eager attention does"
        )
    return "sdpa", reason + (f" ({detail})" if detail else ""), None


def configure(model, speed_cfg, device: torch.device | str, *, per_layer_metadata: bool = False) -> Choice:
    """Pick the attention backend for this run, install it on the model, and say why.

    Args:
        model: a transformers causal LM or a peft model around one.
        speed_cfg: `SpeedConfig` (reads `.attention` and `.packing`).
        device: where the model trains.
        per_layer_metadata: benchmark only: use the variant that rebuilds the metadata in every layer.

    Returns:
        The `Choice`; `revert(model, choice)` undoes it.
    """
    previous = current_implementation(model)
    linear = linear_attention.install(_hf_model(model), device) if getattr(speed_cfg, "packing", True) else None
    choice = _configure(model, speed_cfg, device, previous, per_layer_metadata)
    return replace(choice, reason=f"{choice.reason}; {linear}") if linear else choice


def _configure(model, speed_cfg, device, previous: str, per_layer_metadata: bool) -> Choice:
    if not getattr(speed_cfg, "packing", True):
        return Choice(
            "hf", "packing is off: padded rows use transformers' attention with its padding mask", previous, previous
        )
    name, reason, varlen = choose(model, speed_cfg.attention, device)
    if name == "hf":
        return Choice("hf", reason, previous, previous)
    if varlen is not None:
        if getattr(speed_cfg, "grouped_attention_backward", False):
            if _has_sinks(model):  # the sink rescale needs the whole batch's saved output
                reason += "; whole-batch backward (grouped backward does not apply to attention sinks)"
            else:
                varlen = replace(varlen, grouped_backward=True)
                reason += "; backward a group of whole sequences at a time"
        long, said = _long_rows(model, speed_cfg, torch.device(device), varlen)
        if long is not None:
            varlen = replace(varlen, long_rows=long)
        reason += f"; {said}" if said else ""
        implementation = register_varlen(varlen)
    else:
        implementation = IMPLEMENTATIONS[name]
    encoder_previous, merged = None, False
    if language_and_vision_configs(model)[1] is not None:
        if varlen is not None:
            encoder_previous = vision_encoder.apply_encoder_attention(_hf_model(model))
        reason += (
            "; on the language model, and on the image encoder with all images and windows in one call"
            if encoder_previous is not None
            else "; on the language model (the image encoder keeps transformers' attention)"
        )
        merged = host_merge.install(_hf_model(model))
    apply_attention(model, implementation)
    choice = Choice(
        name, reason, implementation, previous, varlen=varlen, encoder_previous=encoder_previous, host_merge=merged
    )
    return use_per_layer_metadata(model, choice) if per_layer_metadata else choice
