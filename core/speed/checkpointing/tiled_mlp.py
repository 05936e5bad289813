"""The MLP of a checkpointed decoder layer back-propagated a tile of tokens at a time, at no extra compute.

Whole, a recomputed layer's MLP holds gate, up and their product for the batch (3 x tokens x intermediate values)
and its backward about as much again in gradients; tiled, only one tile's exist at a time (docs/performance/memory.md).
The one thing to know: in the recompute `TiledMLP` returns zeros, not the MLP's value. Nothing reads that value,
and its backward runs the MLP forward and backward tile by tile, so every MLP FLOP still runs once per pass.
`tile_for` says where this applies; `hone.core.speed.fused.apply` turns it on (`tile_mlp=True`).
"""

from __future__ import annotations

import contextlib
import weakref
from dataclasses import dataclass

import torch

# Elements of one (tile tokens x intermediate) activation: 2**25 = 64 MiB in bf16, so one tile's gate, up, product
# and their gradients stay near 0.4 GiB whatever the MLP width (an intermediate width of 12,288 gives 2,560 tokens
# per tile: 2**25 // 12,288 rounded down to a multiple of `TILE_MULTIPLE`).
TILE_ELEMENTS = 2**25
# Fewer tokens than this per tile make the MLP GEMMs too short to keep a large GPU busy.
MIN_TILE_TOKENS = 1024
# Tiles are a whole number of GEMM blocks (tensor-core kernels tile the token dimension by 64-256).
TILE_MULTIPLE = 256
# A checkpointed forward over at least this many tiles runs its MLP in pieces even without layer groups: there (a
# 20K-token batch and up on Qwen3-8B) the whole MLP's activations are the forward's largest transient (~37 GiB at a
# 400K-token row), and the pieces' launches cost nothing beside their GEMMs.
PIECEWISE_MIN_TILES = 8

_TILES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # decoder layer -> tokens per tile


def tile_tokens(intermediate_size: int) -> int:
    """Tokens per tile for an MLP of this width (a multiple of `TILE_MULTIPLE`)."""
    tokens = max(MIN_TILE_TOKENS, TILE_ELEMENTS // max(intermediate_size, 1))
    return max(TILE_MULTIPLE, tokens // TILE_MULTIPLE * TILE_MULTIPLE)


def _intermediate_size(mlp: torch.nn.Module) -> int | None:
    up = getattr(mlp, "up_proj", None)
    base = getattr(up, "base_layer", up)
    return getattr(base, "out_features", None)


def _lora_dropout_free(mlp: torch.nn.Module) -> bool:
    for module in mlp.modules():
        for dropout in getattr(module, "lora_dropout", {}).values():
            if not isinstance(dropout, torch.nn.Identity) and getattr(dropout, "p", 1.0) > 0:
                return False
    return True


@dataclass
class TilingUndo:
    """Takes one layer's tiling off again (the `Undo` protocol of `hone.core.speed.fused.patching`)."""

    layer: weakref.ref
    label: str = ""

    def __call__(self) -> bool:
        layer = self.layer()
        return layer is not None and _TILES.pop(layer, None) is not None


def enable_tiling(layer: torch.nn.Module, label: str) -> TilingUndo | str:
    """Mark a pre-norm decoder layer (its forward already rebuilt by `hone.core.speed.fused.apply`) for tiled MLP
    backward.

    Returns:
        The undo, or the reason the layer keeps its MLP whole.
    """
    mlp = getattr(layer, "mlp", None)
    width = _intermediate_size(mlp) if mlp is not None else None
    if width is None:
        return "not a dense gated MLP (no up_proj, e.g. MoE experts): its backward stays whole"
    if not _lora_dropout_free(mlp):
        return "MLP LoRA layers with dropout (a tile-wise recompute would draw other masks)"
    _TILES[layer] = tile_tokens(width)
    return TilingUndo(weakref.ref(layer), label)


def tile_for(layer: torch.nn.Module, hidden: torch.Tensor) -> int | None:
    """Tokens per tile when this call of `layer.mlp(hidden)` should go through `TiledMLP`, else None.

    Only in the recompute of a layer that `enable_tiling` marked (a pre-norm decoder layer whose forward the fused
    kernels rebuilt, so the MLP output goes straight into `residual + mlp(...)`, with dropout-free MLP LoRA layers),
    run by Hone's checkpointer with grad on, not under `torch.compile`, over more tokens than one tile. Everywhere
    else the MLP runs as it is.
    """
    if torch.compiler.is_compiling():
        return None
    tile = _TILES.get(layer)
    if tile is None or not torch.is_grad_enabled() or not hidden.requires_grad:
        return None
    try:
        from hone.core.speed.checkpointing.layer_recompute import is_recomputing
    except ImportError:  # a checkpointer that cannot say when it recomputes: keep the MLP whole
        return None
    if not is_recomputing() or hidden.numel() // hidden.shape[-1] <= tile:
        return None
    return tile


def forward_tile_for(layer: torch.nn.Module, hidden: torch.Tensor) -> int | None:
    """Tokens per piece when this call of `layer.mlp(hidden)` is a no-grad forward that should run a piece at a
    time, else None: in a checkpointed layer whose backward runs in sequence groups
    (`hone.core.speed.checkpointing.layer_groups`), or over at least `PIECEWISE_MIN_TILES` tiles.

    Only then: running in pieces keeps the forward's peak as low as the grouped, tiled backward's, but each piece
    is more kernel launches, which a short step bound by the CPU pays for in time.
    """
    if torch.compiler.is_compiling() or torch.is_grad_enabled():
        return None
    tile = _TILES.get(layer)
    tokens = hidden.numel() // hidden.shape[-1]
    if tile is None or tokens <= tile:
        return None
    if tokens >= PIECEWISE_MIN_TILES * tile:
        return tile
    try:
        from hone.core.speed.checkpointing.layer_recompute import is_piecewise_forward
    except ImportError:
        return None
    return tile if is_piecewise_forward() else None


def mlp_in_pieces(mlp: torch.nn.Module, hidden: torch.Tensor, tile: int) -> torch.Tensor:
    """`mlp(hidden)` without autograd, `tile` tokens at a time: the (tokens x intermediate) activations exist
    for one piece only (in a checkpointed forward they can be the step's largest transient,
    docs/performance/memory.md). Same values: the MLP is token-wise.

    Args:
        mlp: the layer's MLP, called on (tile, H) inputs.
        hidden: (..., H) MLP input.
        tile: tokens per piece.

    Returns:
        (..., out_features) in the MLP's output dtype.
    """
    flat = hidden.reshape(-1, hidden.shape[-1])
    out = None
    for start in range(0, flat.shape[0], tile):
        piece = mlp(flat[start : start + tile])
        if out is None:
            out = piece.new_empty(flat.shape[0], piece.shape[-1])
        out[start : start + tile] = piece
        del piece
    return out.view(*hidden.shape[:-1], out.shape[-1])


def _autocast_state(device_type: str) -> tuple[bool, torch.dtype]:
    if device_type == "meta":  # no autocast there (the step planner runs the MLP on meta tensors)
        return False, torch.get_default_dtype()
    return torch.is_autocast_enabled(device_type), torch.get_autocast_dtype(device_type)


class TiledMLP(torch.autograd.Function):
    """Forward: zeros shaped like `mlp(hidden)` (in a recompute whose values are never read); backward: the MLP
    recomputed and back-propagated tile by tile.

    Inside Hone's checkpointer (`hone.core.speed.checkpointing.checkpointer`) a layer runs twice: once without
    autograd in forward, and once with autograd in backward, only to rebuild its graph; the value that recompute
    produces is never read. So in the recompute the MLP is not run: this returns zeros of the MLP output's shape
    (the residual add that consumes them needs no values for its backward) and keeps the MLP input. Its backward
    then runs the MLP forward and backward tile by tile (under the forward's autocast state): every MLP FLOP of the
    step still happens once in forward, once in the recompute and once in backward, as without tiling.

    Args (forward): hidden (..., H) MLP input that requires grad; mlp (the module, called on (tile, H) inputs);
    out_features: the MLP output width; tile: tokens per tile.

    The MLP's parameters get their gradients accumulated into `.grad` by `torch.autograd.backward`, as Hone's
    checkpointer does for the whole layer (gradients reach parameters through `loss.backward()`).
    """

    @staticmethod
    def forward(ctx, hidden, mlp, out_features, tile):
        ctx.save_for_backward(hidden)
        ctx.mlp, ctx.tile = mlp, tile
        ctx.autocast = _autocast_state(hidden.device.type)
        return hidden.new_zeros(*hidden.shape[:-1], out_features)

    @staticmethod
    def backward(ctx, grad):
        (hidden,) = ctx.saved_tensors
        flat = hidden.detach().reshape(-1, hidden.shape[-1])
        grad = grad.reshape(-1, grad.shape[-1])
        grad_hidden = torch.empty_like(flat)
        enabled, dtype = ctx.autocast
        device_type = hidden.device.type
        for start in range(0, flat.shape[0], ctx.tile):
            piece = flat[start : start + ctx.tile].detach().requires_grad_(True)
            replay = torch.autocast(device_type, dtype=dtype) if enabled else contextlib.nullcontext()
            with torch.enable_grad(), replay:
                out = ctx.mlp(piece)
            torch.autograd.backward(out, grad[start : start + ctx.tile])
            grad_hidden[start : start + ctx.tile] = piece.grad
            del out, piece  # this tile's activations go before the next tile's exist
        ctx.mlp = None
        return grad_hidden.view(hidden.shape), None, None, None


def tiled_mlp(layer: torch.nn.Module, hidden: torch.Tensor, tile: int) -> torch.Tensor:
    """`layer.mlp(hidden)` through `TiledMLP` (only where `tile_for` said so)."""
    mlp = layer.mlp
    out_features = getattr(getattr(mlp.down_proj, "base_layer", mlp.down_proj), "out_features", hidden.shape[-1])
    return TiledMLP.apply(hidden, mlp, out_features, tile)
