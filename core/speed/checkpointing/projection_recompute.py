"""A recomputed layer's q and k projections, run a third time in backward instead of kept, for large batches.

Models with a norm on each head's q and k (Qwen3, Gemma 3, OLMo 2, ...) keep the projections' outputs only for
those norms' backward: 10 KiB a token on Qwen3-8B, 3.9 GiB of a 409,600-token row's backward. While a checkpointed
layer is recomputed over at least `RECOMPUTE_TOKENS` tokens, such an output is saved as a recipe instead (the
projection and its input, which the LoRA path keeps anyway), and the norm's backward runs the projection again
without autograd. The norm's backward comes after attention's, whose workspace sets the layer's peak; so the
projections are alive again only after the peak. The cost is the two GEMMs: about 3 % of a layer's linear work, and
less of a step whose rows are long enough for attention to dominate.
"""

from __future__ import annotations

import contextlib
import weakref
from dataclasses import dataclass

import torch

# Batches of at least this many tokens recompute the projections (the memory planner counts the same way): where
# memory binds (1.25 GiB of Qwen3-8B's backward at this size), above the 64K-token batches of 16-32K rows whose speed
# is measured against Unsloth's.
RECOMPUTE_TOKENS = 1 << 17
# Attention modules with these children: a projection's output feeds the matching norm, and nothing else keeps it.
_PAIRS = (("q_proj", "q_norm"), ("k_proj", "k_norm"))


def projections(layer: torch.nn.Module) -> tuple[torch.nn.Module, ...]:
    """The projections in `layer` whose outputs go to a head norm. None in a layer whose frozen weights FSDP splits
    across processes (`train.parallel = fsdp`): running them again in backward is not tested there."""
    if isinstance(layer, _fsdp_module()):
        return ()
    return tuple(
        getattr(module, proj)
        for module in layer.modules()
        for proj, norm in _PAIRS
        if isinstance(getattr(module, proj, None), torch.nn.Module)
        and isinstance(getattr(module, norm, None), torch.nn.Module)
    )


def _fsdp_module() -> type | tuple[type, ...]:
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # a torch built without distributed support
        return ()
    return FSDPModule


def _draws_random(module: torch.nn.Module) -> bool:
    """Dropout in training (LoRA's own, say): run again, the projection would give another output."""
    return any(isinstance(m, torch.nn.Dropout) and m.p > 0 and m.training for m in module.modules())


def _autocast_state() -> list[tuple[str, bool, torch.dtype]]:
    return [(kind, torch.is_autocast_enabled(kind), torch.get_autocast_dtype(kind)) for kind in ("cpu", "cuda")]


@dataclass(eq=False)
class _Recipe:
    """How to make a saved view of a projection's output again: the call, the autocast state it ran under, and the
    view's geometry (`offset` counted from the start of the output's own memory)."""

    projection: torch.nn.Module
    args: tuple
    kwargs: dict
    autocast: list[tuple[str, bool, torch.dtype]]
    size: torch.Size
    stride: tuple[int, ...]
    offset: int
    base_size: torch.Size
    base_stride: tuple[int, ...]
    dtype: torch.dtype

    def make(self) -> torch.Tensor:
        with torch.no_grad(), contextlib.ExitStack() as stack:
            for kind, enabled, dtype in self.autocast:  # the forward's autocast, where backward's differs
                if (enabled, dtype) != (torch.is_autocast_enabled(kind), torch.get_autocast_dtype(kind)):
                    stack.enter_context(torch.autocast(kind, dtype=dtype, enabled=enabled))
            base = _root(self.projection(*self.args, **self.kwargs))
        if base.shape != self.base_size or base.stride() != self.base_stride or base.dtype != self.dtype:
            raise RuntimeError(
                f"{type(self.projection).__name__} recomputed for a head norm's backward gave {tuple(base.shape)} "
                f"{base.dtype} with strides {base.stride()}, not its forward's {tuple(self.base_size)} {self.dtype} "
                f"with strides {self.base_stride}; set speed.checkpoint = gpu or offload-double with smaller batches"
            )
        return base.as_strided(self.size, self.stride, base.storage_offset() + self.offset)


def _root(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor that owns a view's memory (a projection may return its 2-D GEMM output viewed as 3-D)."""
    return tensor if tensor._base is None else tensor._base


class _Book:
    """The memory of the current recompute's projection outputs, by the identity of the tensor owning it (held
    weakly: a freed tensor's id may be reused, and a weak reference tells the two apart)."""

    def __init__(self) -> None:
        self.outputs: dict[int, tuple[weakref.ref, torch.nn.Module, tuple, dict, list]] = {}

    def remember(self, module: torch.nn.Module, args: tuple, kwargs: dict, output) -> None:
        if not torch.is_tensor(output) or not output.is_contiguous() or _draws_random(module):
            return
        base = _root(output)
        if base.numel() == output.numel():  # the output is all of it (not q of a fused qkv GEMM, say)
            self.outputs[id(base)] = (weakref.ref(base), module, args, kwargs, _autocast_state())

    def pack(self, saved: torch.Tensor):
        base = _root(saved)
        entry = self.outputs.get(id(base))
        if entry is None or entry[0]() is not base:
            return saved
        _, module, args, kwargs, autocast = entry
        return _Recipe(
            module,
            args,
            kwargs,
            autocast,
            saved.size(),
            saved.stride(),
            saved.storage_offset() - base.storage_offset(),
            base.size(),
            base.stride(),
            base.dtype,
        )


def _unpack(packed):
    return packed.make() if isinstance(packed, _Recipe) else packed


@contextlib.contextmanager
def recomputed_projections(layer: torch.nn.Module | None, tokens: int, enabled_from: int):
    """Within it, the head-normed projections of `layer` are saved as recipes, when `tokens` (the batch's) is at least
    `enabled_from` (0: never); otherwise it changes nothing. Not while a CUDA graph is recorded."""
    targets = projections(layer) if layer is not None and enabled_from and tokens >= enabled_from else ()
    if not targets or (torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()):
        yield
        return
    book = _Book()
    handles = [target.register_forward_hook(book.remember, with_kwargs=True) for target in targets]
    try:
        with torch.autograd.graph.saved_tensors_hooks(book.pack, _unpack):
            yield
    finally:
        for handle in handles:
            handle.remove()
