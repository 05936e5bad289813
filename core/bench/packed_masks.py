"""Whether a model's own attention masks keep the sequences of one packed row apart, and the masks that do.

A packed row (`DataCollatorWithFlattening`: sequences back to back, position ids restarting at 0) is only right when
each sequence attends to itself alone. Most transformers models find the restarts in `position_ids` when they build
their masks; gpt-oss builds its masks without them, so with its own masks a packed row's later sequences attend to
the earlier ones and the loss is not the sequences' loss. The benchmark's reference and Hone's "every path off" run
must compute the sequences' loss like every other run, so for such a model they are given per-sequence masks:
`block_mask_mapping` for the reference (transformers takes a mapping of layer type to a 4-D mask), Hone's shared
block mask for its own run.
"""

from __future__ import annotations

import torch

from hone.core.speed.attention.backends import block_causal_mask

# Two sequences of two tokens: the smallest packed row where crossing shows (the third token's view of the first).
_PROBE_POSITIONS = (0, 1, 0, 1)


def _attention_modules(model) -> list[torch.nn.Module]:
    """Each decoder layer's self-attention module (those are what receive the masks)."""
    return [module for name, module in model.named_modules() if name.endswith("self_attn")]


def _sees_first_sequence(mask) -> bool:
    """Whether the mask an attention layer received lets the second sequence's first token (row 2) see token 0.
    None means plain causal attention over the whole row: it does."""
    if mask is None:
        return True
    if isinstance(mask, dict):
        return any(_sees_first_sequence(m) for m in mask.values())
    entry = mask[..., 2, 0].reshape(-1)[0]
    if mask.dtype == torch.bool:
        return bool(entry)
    return bool(entry > torch.finfo(mask.dtype).min / 2)  # additive: large negatives are masked


@torch.no_grad()
def packed_sequences_cross(model) -> bool:
    """Whether `model`'s own masks let a packed row's sequences attend to one another: one forward of a 4-token
    row (two sequences), recording the mask each self-attention layer receives. False when no layer receives
    a mask argument this probe can read (nothing to fix from outside then)."""
    seen: list[bool] = []

    def record(module, args, kwargs):
        if "attention_mask" in kwargs:
            seen.append(_sees_first_sequence(kwargs["attention_mask"]))

    device = next(model.parameters()).device
    positions = torch.tensor([_PROBE_POSITIONS], device=device)
    ids = torch.ones_like(positions)
    hooks = [m.register_forward_pre_hook(record, with_kwargs=True) for m in _attention_modules(model)]
    training = model.training
    try:
        model.eval()
        model(input_ids=ids, position_ids=positions, use_cache=False)
    finally:
        model.train(training)
        for hook in hooks:
            hook.remove()
    return any(seen)


def _layer_windows(config) -> dict[str, int | None]:
    """Each layer type of the config -> its sliding window (None: full causal attention)."""
    text = getattr(config, "text_config", None) or config
    kinds = set(getattr(text, "layer_types", None) or ["full_attention"])
    windows: dict[str, int | None] = {}
    for kind in kinds:
        if kind == "full_attention":
            windows[kind] = None
        elif kind == "sliding_attention":
            windows[kind] = int(text.sliding_window)
        else:
            raise ValueError(f"no per-sequence mask for layer type {kind!r}: only full and sliding attention")
    return windows


def block_mask_mapping(model, position_ids: torch.Tensor) -> dict[str, torch.Tensor]:
    """Layer type -> a (1, 1, T, T) mask keeping each sequence of the packed row `position_ids` ((1, T), restarting
    at 0 per sequence) to itself, causal and within the layer type's window: bool for SDPA, additive (0 or the
    dtype's lowest value) in the model's dtype for eager attention, which adds it to the scores."""
    flat = position_ids.reshape(-1)
    starts = torch.nonzero(flat == 0).reshape(-1)
    cu = torch.cat([starts, torch.tensor([flat.numel()], device=flat.device)]).to(torch.int32)
    total = flat.numel()
    dtype = next(model.parameters()).dtype
    additive = model.config._attn_implementation == "eager"
    masks = {}
    for kind, window in _layer_windows(model.config).items():
        mask = block_causal_mask(cu, total, window)
        if additive:
            lowest = torch.finfo(dtype).min
            mask = torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(~mask, lowest)
        masks[kind] = mask
    return masks
