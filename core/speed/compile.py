"""Regional compilation: `torch.compile` each decoder block, not the whole model.

Every decoder layer runs the same code, so dynamo traces one block and the others reuse it; the loss, the LM head
and the trainer's own code stay eager. The one thing to know: compilation happens lazily, on the first step
(forward, then backward) and again once when the packed sequence length first changes, and `CompileReport`
measures that time so the trainer can report it once and keep it out of step times.
"""

from __future__ import annotations

import contextlib
import threading
import time
import weakref
from dataclasses import dataclass, field

import torch


class _CompileClock:
    """Wall time spent inside torch.compile (dynamo tracing, lazy backward compiles) while it is running."""

    def __init__(self):
        self._lock = threading.Lock()
        self._started: float | None = None
        self.seconds = 0.0
        self.compiles = 0
        self._handler = getattr(torch._dynamo, "callback_handler", None)
        if self._handler is not None:
            self._handler.register_start_callback(self._start)
            self._handler.register_end_callback(self._end)

    @property
    def available(self) -> bool:
        return self._handler is not None

    def _start(self, *_args) -> None:
        with self._lock:
            self._started = time.perf_counter()

    def _end(self, *_args) -> None:
        with self._lock:
            if self._started is not None:
                self.seconds += time.perf_counter() - self._started
                self.compiles += 1
                self._started = None

    def stop(self) -> None:
        if self._handler is not None:
            for remove, callback in (
                (self._handler.remove_start_callback, self._start),
                (self._handler.remove_end_callback, self._end),
            ):
                with contextlib.suppress(ValueError):
                    remove(callback)
            self._handler = None


@dataclass
class CompileReport:
    """What `compile_blocks` compiled, and how long compiling has taken so far.

    Attributes:
        blocks: how many blocks were compiled; block_types: their class names.
        skipped: blocks left eager, with the reason.
        options: the `torch.compile` options used.
    """

    blocks: int
    block_types: list[str]
    skipped: list[str] = field(default_factory=list)
    options: dict = field(default_factory=dict)
    _clock: _CompileClock | None = field(default=None, repr=False)
    _reported: float = field(default=0.0, repr=False)

    @property
    def compile_seconds(self) -> float | None:
        """Total seconds spent compiling since `compile_blocks` (None where torch cannot tell)."""
        return self._clock.seconds if self._clock is not None and self._clock.available else None

    @property
    def compiles(self) -> int:
        """How many compilations (graphs traced, backward graphs compiled) have run."""
        return self._clock.compiles if self._clock is not None else 0

    def take_new_seconds(self) -> float:
        """Seconds spent compiling since the last call: subtract from the step they happened in, report once."""
        total = self.compile_seconds or 0.0
        new, self._reported = total - self._reported, total
        return new

    def summary(self) -> str:
        kinds = ", ".join(sorted(set(self.block_types))) or "no blocks"
        timing = f"; compiled in {self.compile_seconds:.1f} s" if self.compile_seconds else ""
        return f"{self.blocks} x {kinds}{timing}"

    def to_dict(self) -> dict:
        return {
            "blocks": self.blocks,
            "block_types": sorted(set(self.block_types)),
            "skipped": list(self.skipped),
            "options": {k: str(v) for k, v in self.options.items()},
            "compile_seconds": self.compile_seconds,
            "compiles": self.compiles,
        }


_COMPILED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> (blocks, report)


def decoder_blocks(model: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    """The repeated blocks of a (peft) transformers model: its `_no_split_modules` classes, else every
    gradient-checkpointing layer."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    names = set(getattr(base, "_no_split_modules", None) or [])
    blocks = [(n, m) for n, m in base.named_modules() if type(m).__name__ in names]
    if not blocks:
        from transformers.modeling_layers import GradientCheckpointingLayer

        blocks = [(n, m) for n, m in base.named_modules() if isinstance(m, GradientCheckpointingLayer)]
    return blocks


def compile_blocks(
    model: torch.nn.Module,
    *,
    mode: str | None = None,
    dynamic: bool | None = None,
    backend: str = "inductor",
    fullgraph: bool = False,
) -> CompileReport:
    """Compile each decoder block of `model` in place (`nn.Module.compile`); call after LoRA and kernels.

    The blocks reuse one trace because every layer binds the same forward functions (`hone.core.speed.fused.apply`
    shares them), so dynamo's guards pass; compiling blocks instead of the whole model takes seconds rather than
    minutes. Inside compiled blocks Hone's Triton kernels step aside for their torch references, which inductor
    fuses. Compile time is measured through dynamo's compile callbacks (`CompileReport.take_new_seconds`).

    Args:
        mode: torch.compile mode (None = default). CUDA graphs (`"reduce-overhead"`) are not the default: packed
            batches change length every step, and each new length would record a new graph; they pay only for
            fixed-shape batches of very small models.
        dynamic: None lets dynamo make the sequence length dynamic when it first changes.
        backend: "inductor" on GPU; tests use "eager" to exercise tracing without a compiler.
        fullgraph: require one graph per block (graph breaks raise).

    Returns:
        A `CompileReport`; its clock runs until `uncompile_blocks`.
    """
    if model in _COMPILED:
        return _COMPILED[model][1]
    options = {"mode": mode, "dynamic": dynamic, "backend": backend, "fullgraph": fullgraph}
    compiled, kinds, skipped = [], [], []
    for name, block in decoder_blocks(model):
        if getattr(block, "_compiled_call_impl", None) is not None:
            skipped.append(f"{name}: already compiled")
            continue
        block.compile(**options)
        compiled.append(block)
        kinds.append(type(block).__name__)
    clock = _CompileClock()
    weakref.finalize(model, clock.stop)  # stop counting when the model goes away without uncompile_blocks
    report = CompileReport(blocks=len(compiled), block_types=kinds, skipped=skipped, options=options, _clock=clock)
    _COMPILED[model] = (compiled, report)
    return report


def uncompile_blocks(model: torch.nn.Module) -> int:
    """Put the eager blocks back (drops the compiled wrappers); returns how many were restored."""
    entry = _COMPILED.pop(model, None)
    if entry is None:
        return 0
    blocks, report = entry
    for block in blocks:
        block._compiled_call_impl = None
    if report._clock is not None:
        report._clock.stop()
    return len(blocks)
