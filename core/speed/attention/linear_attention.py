"""Packed rows through Gated DeltaNet layers (Qwen3-Next's linear attention) with each sequence kept to itself.

transformers' Gated DeltaNet runs a causal depthwise convolution, then the gated delta rule. On a packed row
(`cu_seq_lens_q` in the layer's kwargs) its convolution runs over the whole row, so the first kernel - 1 tokens of a
sequence see the end of the one before; its torch delta rule ignores the offsets too (only flash-linear-attention's
kernel reads them). `install` swaps both functions in the model's modeling module for ones that keep packed
sequences apart: the convolution over the sequences laid out with kernel - 1 zeros before each, and the delta rule
one sequence at a time unless flash-linear-attention is behind it and passes a check on the GPU (`probe_native`;
fla 0.6 refuses Triton < 3.7.1 on Hopper). Calls on unpacked batches (no offsets, several rows, a cache's final
state asked for) go to transformers' functions unchanged, except that a refused fla is bypassed there too, so the
swap stays in place for the process; the first install decides for it.
"""

from __future__ import annotations

import functools
import sys

import torch
import torch.nn.functional as F

from hone.core.data.batch_lengths import registered

CONV, RULE = "causal_conv1d_fn", "torch_chunk_gated_delta_rule"
_SWAPPED = "_hone_packed_linear_attention"


def gated_deltanet_modules(model) -> list[torch.nn.Module]:
    return [m for m in model.modules() if type(m).__name__.endswith("GatedDeltaNet")]


def unsupported(model) -> str | None:
    """Why packed rows could not be kept apart in this model's Gated DeltaNet layers (None: they can, or it has
    none)."""
    for name in {type(m).__module__ for m in gated_deltanet_modules(model)}:
        module = sys.modules.get(name)
        missing = [f for f in (CONV, RULE) if not callable(getattr(module, f, None))]
        if missing:
            return (
                f"its Gated DeltaNet (linear attention) layers call no {' / '.join(missing)} in {name} that Hone "
                "can make keep packed sequences apart (another transformers version)"
            )
    return None


def install(model, device: torch.device | str) -> str | None:
    """Swap the convolution and delta rule of the modules defining the model's Gated DeltaNet layers (once per
    module; flash-linear-attention's rule is probed on `device` first). Returns what packed rows now run in those
    layers, for the run log (None: the model has none)."""
    layers = gated_deltanet_modules(model)
    if not layers or unsupported(model) is not None:  # the trainer pads this model's rows (`packing_blocker`)
        return None
    said = []
    for name in {type(m).__module__ for m in layers}:
        module = sys.modules[name]
        if not getattr(module, _SWAPPED, False):
            rule = getattr(module, RULE)
            refused = None
            if reads_offsets(rule):
                refused = (
                    probe_native(rule, torch.device(device))
                    if torch.device(device).type == "cuda"
                    else "flash-linear-attention's kernels need a CUDA GPU"
                )
            setattr(module, CONV, packed_conv(getattr(module, CONV)))
            setattr(module, RULE, packed_rule(rule, native=reads_offsets(rule) and refused is None, refused=refused))
            setattr(module, _SWAPPED, True)
        said.append(getattr(module, RULE).hone_says)
    return "Gated DeltaNet layers: the convolution per packed sequence, then " + "; ".join(sorted(set(said)))


def _offsets(kwargs) -> torch.Tensor | None:
    return kwargs.get("cu_seq_lens_q")


def _lengths(cu_seqlens: torch.Tensor) -> list[int]:
    """Sequence lengths from the batch registered by Hone's collation (no host sync); read back otherwise."""
    found = registered(cu_seqlens)
    if found is not None:
        return [int(n) for n in found[0]]
    return torch.diff(cu_seqlens).tolist()


def _gap_positions(cu_seqlens: torch.Tensor, tokens: int, gap: int) -> torch.Tensor:
    """Where each token of the packed row sits once `gap` zeros precede every sequence (device ops only)."""
    found = registered(cu_seqlens)
    key = ("linear attention gaps", gap)
    if found is not None and key in found[1]:
        return found[1][key]
    counts = torch.diff(cu_seqlens)
    sequence = torch.repeat_interleave(torch.arange(counts.numel(), device=counts.device), counts, output_size=tokens)
    positions = torch.arange(tokens, device=counts.device) + gap * (sequence + 1)
    if found is not None:
        found[1][key] = positions
    return positions


def packed_conv(original):
    """transformers' causal depthwise convolution, each packed sequence convolved on its own."""

    @functools.wraps(original)
    def conv(hidden_states, weight, bias=None, activation=None, **kwargs):
        cu_seqlens = _offsets(kwargs)
        if cu_seqlens is None or hidden_states.shape[0] != 1:
            return original(hidden_states, weight, bias, activation=activation, **kwargs)
        from transformers.activations import ACT2FN

        channels, tokens = hidden_states.shape[1], hidden_states.shape[2]
        gap = weight.shape[-1] - 1
        sequences = cu_seqlens.numel() - 1
        positions = _gap_positions(cu_seqlens, tokens, gap)
        spread = hidden_states.new_zeros(1, channels, tokens + gap * sequences).index_copy(2, positions, hidden_states)
        out = F.conv1d(spread.to(weight.dtype), weight.unsqueeze(1), bias, groups=channels)
        out = out.index_select(2, positions - gap)  # a token's window ends at it: it starts `gap` earlier
        if activation is not None:
            out = ACT2FN[activation](out)
        return out.to(hidden_states.dtype)

    return conv


def _closure(function, name: str):
    """A value the transformers kernel-or-fallback wrapper closed over (None when it is not there)."""
    names = getattr(getattr(function, "__code__", None), "co_freevars", ())
    if name not in names or function.__closure__ is None:
        return None
    return function.__closure__[names.index(name)].cell_contents


def reads_offsets(rule) -> bool:
    """Whether transformers' delta rule runs flash-linear-attention's kernel, which reads `cu_seqlens` itself."""
    return bool(_closure(rule, "is_new_implementation")) and _closure(rule, "package") == "fla"


def _torch_rule(rule):
    """transformers' own torch delta rule behind its kernel-or-fallback wrapper."""
    return _closure(rule, "torch_function") or rule


def probe_native(rule, device: torch.device) -> str | None:
    """Why flash-linear-attention's rule cannot train packed rows on this device, or None when it can: one forward
    and backward over two packed sequences, against transformers' torch rule run on each."""
    gen = torch.Generator(device=device).manual_seed(0)
    lengths, heads, dim = (40, 24), 2, 32
    tokens = sum(lengths)
    q, k, v = (torch.randn(1, tokens, heads, dim, device=device, generator=gen, requires_grad=True) for _ in range(3))
    g = (-torch.rand(1, tokens, heads, device=device, generator=gen)).requires_grad_()
    beta = torch.rand(1, tokens, heads, device=device, generator=gen).requires_grad_()
    inputs = (q, k, v, g, beta)
    cu_seqlens = torch.tensor([0, lengths[0], tokens], device=device, dtype=torch.int32)
    try:
        out = rule(q, k, v, g=g, beta=beta, use_qk_l2norm_in_kernel=True, cu_seqlens=cu_seqlens)[0]
        got = [out, *torch.autograd.grad(out.square().sum(), inputs)]
    except Exception as error:  # the kernel refuses this GPU / Triton pairing, or fails to build
        return f"flash-linear-attention's delta rule fails here ({str(error).splitlines()[0][:200]})"
    plain, outs, start = _torch_rule(rule), [], 0
    for length in lengths:
        rows = slice(start, start + length)
        outs.append(
            plain(q[:, rows], k[:, rows], v[:, rows], g=g[:, rows], beta=beta[:, rows], use_qk_l2norm_in_kernel=True)[0]
        )
        start += length
    out = torch.cat(outs, dim=1)
    want = [out, *torch.autograd.grad(out.square().sum(), inputs)]
    worst = max(((a - b).norm() / b.norm().clamp_min(1e-12)).item() for a, b in zip(got, want, strict=True))
    if worst > 1e-2:
        return f"flash-linear-attention's delta rule differs from transformers' torch rule here (relative {worst:.1e})"
    return None


def packed_rule(original, *, native: bool, refused: str | None = None):
    """transformers' chunked gated delta rule: flash-linear-attention's kernel over the packed row where it reads the
    offsets and trains on this device (`native`), otherwise the torch rule one packed sequence at a time. Where
    flash-linear-attention is installed but `refused`, unpacked calls take the torch rule too."""
    plain = original if native else _torch_rule(original)

    @functools.wraps(original)
    def rule(query, key, value, g, beta, *args, cu_seqlens=None, **kwargs):
        if native:
            return original(query, key, value, g, beta, *args, cu_seqlens=cu_seqlens, **kwargs)
        if cu_seqlens is None:
            return plain(query, key, value, g, beta, *args, **kwargs)
        if query.shape[0] != 1 or kwargs.get("output_final_state") or kwargs.get("initial_state") is not None:
            return original(query, key, value, g, beta, *args, cu_seqlens=cu_seqlens, **kwargs)
        outs, start = [], 0
        for length in _lengths(cu_seqlens):
            rows = slice(start, start + length)
            out, _ = plain(query[:, rows], key[:, rows], value[:, rows], g[:, rows], beta[:, rows], *args, **kwargs)
            outs.append(out)
            start += length
        return torch.cat(outs, dim=1), None

    why = refused or "flash-linear-attention is not installed"
    rule.hone_says = (
        "flash-linear-attention's delta rule over the whole row"
        if native
        else f"transformers' torch delta rule one sequence at a time ({why})"
    )
    return rule
