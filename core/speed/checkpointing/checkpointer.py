"""Activation checkpointing of decoder layers, with the saved inputs kept on the GPU or offloaded to pinned host memory.

`apply_checkpointing` makes a `Checkpointer` the checkpoint function of every transformers
`GradientCheckpointingLayer` (`revert_checkpointing` undoes it) in one of the modes of `speed.checkpoint`; the
`Checkpointer` docstring says what each mode does, `policy.choose_mode` which one `auto` takes. The one thing to
know: a checkpointed layer back-propagates inside its own backward node, so its parameter gradients reach `.grad`
through `loss.backward()` (what the trainer calls), not through `torch.autograd.grad(loss, params)`.
"""

from __future__ import annotations

import functools
import weakref
from dataclasses import dataclass

import torch
from torch.utils.checkpoint import checkpoint as recompute_checkpoint

from hone.core.machine.pinned_memory import available_system_memory, offload_budget, processes_on_this_host
from hone.core.speed.checkpointing.layer_groups import LayerCall, auto_group_tokens
from hone.core.speed.checkpointing.layer_recompute import _CheckpointedLayer, _needs_grad, is_recomputing
from hone.core.speed.checkpointing.offload_buffers import (
    CudaCopier,
    HostSlot,
    HostSlots,
    ReloadBuffer,
    SyncCopier,
    allocate_reload_buffer,
    reload_buffer_bytes,
    second_buffer_decision,
    size_text,
    tight_memory_reason,
)

CHECKPOINT_MODES = ("gpu", "offload", "offload-double")  # modes that install a Checkpointer ("off" installs none)

# GPU memory that must stay free at a step's peak for a second reload buffer: allocator fragmentation and the
# step-to-step variation of the transient peak (packing plans, MoE routing imbalance) are a few hundred MiB.
HEADROOM_MARGIN_BYTES = 1 << 30


# ---------------------------------------------------------------------------------------------------------------
# The checkpoint function (its autograd Function is layer_recompute.py's)
# ---------------------------------------------------------------------------------------------------------------


@dataclass(eq=False)
class _SavedInput:
    """One layer input waiting for its backward pass: kept on the device, or in a host slot (and maybe already
    copied back into a reload buffer)."""

    seq: int
    shape: torch.Size
    dtype: torch.dtype
    layer: str = ""
    kept: torch.Tensor | None = None
    slot: HostSlot | None = None
    buffer: ReloadBuffer | None = None
    ready: object | None = None  # event recorded when the copy into `buffer` is done
    give_back: weakref.finalize | None = None  # returns the host slot, at release or when dropped unused
    check: torch.Tensor | None = None  # with `verify`: a device copy of the input as saved

    @property
    def nbytes(self) -> int:
        return self.shape.numel() * self.dtype.itemsize


@dataclass(frozen=True)
class IntegrityCheck:
    """One comparison made with `Checkpointer(verify=True)`: how many bytes of a layer's input differed, at `where`
    ("pinned host copy", "reload buffer", "reload buffer after backward", or "kept input" in gpu mode), from the
    input as the forward pass saw it. `seq` counts saved inputs since the Checkpointer was made."""

    layer: str
    seq: int
    where: str
    differing_bytes: int
    nbytes: int


def _differing_bytes(a: torch.Tensor, b: torch.Tensor) -> int:
    """Bytes that differ between two tensors of one shape and dtype (bitwise: NaNs and -0.0 count as themselves)."""
    flat_a = a.detach().contiguous().view(-1).view(torch.uint8)
    flat_b = b.detach().contiguous().view(-1).view(torch.uint8)
    return int((flat_a != flat_b).sum().item())


class Checkpointer:
    """The checkpoint function of every decoder layer, and the memory its saved inputs live in.

    Called by transformers as `checkpointer(layer_call, hidden_states, *rest)`. `read_and_reset()` gives the step's
    StepMetrics fields. On a CUDA device the copies run on a side stream; on a CPU device they are synchronous
    (correct, pointless for speed: `choose_mode` never offloads on the CPU, tests use it to check the bookkeeping).

    Modes (`speed.checkpoint`; `off` installs no Checkpointer, `auto` is resolved by `policy.choose_mode`):
    - `gpu`: each decoder layer keeps only its input; backward recomputes the layer from it.
    - `offload`: the input goes to pinned host memory (copied on a side stream while the forward pass runs on);
      backward copies it back into one GPU buffer, waits for the copy, recomputes. The GPU idles during each copy.
    - `offload-double`: two GPU buffers; while layer i is recomputed from one, the input of layer i-1 is copied
      into the other, so the copy hides behind compute. Falls back to one buffer (with a Notice) when a second
      buffer does not fit or memory gets tight.

    Copy ordering on a GPU follows the rules in `offload_buffers.CudaCopier`: every copy waits for the work the
    compute stream has queued so far, and a recompute waits for its reload. The reload buffer a recompute reads is
    marked `reading` from `load` to `release` (after the layer's backward is queued); the next copy into it is
    issued only after that, so waiting for the queued compute work covers its last reader.

    Args:
        mode: gpu, offload or offload-double.
        device: the device the layers compute on.
        max_buffer_bytes: the most device memory the reload buffers may hold together; a second buffer that would
            pass it is not allocated (one buffer always is: the recompute needs the input on the device).
        note: `note(topic, message, level)` for Notice events (fallbacks).
        streams: the CUDA stream API the copies go through (torch.cuda's by default); with a stand-in, the CUDA copy
            path runs on any device (the tests check its ordering on the CPU with a stream simulator).
        verify: keep a device copy of every saved input and compare the bytes the layer is recomputed from with it
            (in host memory, in the reload buffer, and again after the layer's backward): `integrity` lists the
            results. A diagnostic for tests: it costs memory and synchronizes the host at every layer.
        group_tokens: recompute and back-propagate each layer a group of whole sequences of at most this many tokens
            at a time (`hone.core.speed.checkpointing.layer_groups`); 0 = whole layers, -1 = a size chosen from the
            hidden size. `grouped_layers` counts the layer backward passes that ran in groups.
        host_budget_bytes: the most pinned host memory the offloaded inputs may hold together; the inputs past it (a
            step's last layers) stay on the GPU. None: on a GPU, `offload_budget` of the system memory available at
            the first offload (what the memory planner assumes), shared with the other training processes on the
            host; on a CPU device, no limit.
        cudart: the CUDA runtime calls host slots are registered with (tests pass a stand-in).
    """

    def __init__(
        self,
        mode: str,
        device,
        *,
        max_buffer_bytes: int | None = None,
        note=None,
        streams=None,
        verify: bool = False,
        group_tokens: int = 0,
        host_budget_bytes: int | None = None,
        cudart=None,
    ):
        if mode not in CHECKPOINT_MODES:
            raise ValueError(f"checkpoint mode {mode!r} is not one of {CHECKPOINT_MODES}")
        self.device = torch.device(device)
        self.requested = mode
        self.offloads = mode != "gpu"
        self.double = mode == "offload-double"
        self.max_buffer_bytes = max_buffer_bytes
        self.cuda = self.device.type == "cuda"
        use_streams = self.offloads and (self.cuda or streams is not None)
        self.copier = CudaCopier(self.device, streams) if use_streams else SyncCopier()
        # A registered slot is unregistered only after this device's queued copies from or into it have run.
        synchronize = functools.partial(torch.cuda.synchronize, self.device) if self.cuda else None
        self.host = HostSlots(pin=self.cuda, budget_bytes=host_budget_bytes, cudart=cudart, synchronize=synchronize)
        self._budget_pending = host_budget_bytes is None and self.cuda
        self._budget_noted = False
        self.kept_over_budget = 0  # inputs kept on the GPU in the last step because the host budget was reached
        self.buffers: list[ReloadBuffer] = []
        self.notes: list[str] = []
        self.layer_names: dict[int, str] = {}  # id(layer module) -> its name in the model, for messages
        self.verify = verify
        self.integrity: list[IntegrityCheck] = []
        self.group_tokens = group_tokens
        self.grouped_layers = 0
        # Batches of at least this many tokens run the head-normed q/k projections again in backward instead of
        # keeping their outputs (projection_recompute.py); 0: never. The run's setup turns it on.
        self.projection_recompute_tokens = 0
        self.kept_layers = 0  # the last decoder layers, left unwrapped by `apply_checkpointing`
        self._layers: list[weakref.ref] = []  # every decoder layer it checkpoints or may (the kept ones)
        self._note = note
        self._seq = 0
        self._turn = 0  # round robin over the reload buffers
        self._pending: list[weakref.ref] = []  # offloaded inputs waiting for backward, in forward order
        self._host_failed = False
        with torch.inference_mode(False):
            self._anchor = torch.empty(0, requires_grad=True)

    @property
    def mode(self) -> str:
        """The mode in effect now (offload-double becomes offload after a fallback)."""
        if not self.offloads:
            return "gpu"
        return "offload-double" if self.double else "offload"

    def recompute_every_layer(self) -> int:
        """Give up the kept layers (`apply_checkpointing`'s `kept_layers`): from the next forward on every layer is
        recomputed from its input. Returns how many layers were kept (0: nothing to give up)."""
        kept, self.kept_layers = self.kept_layers, 0
        for ref in self._layers:
            layer = ref()
            if layer is not None:
                layer.gradient_checkpointing = True
        return kept

    @property
    def buffer_bytes(self) -> int:
        return sum(b.capacity for b in self.buffers)

    def __call__(self, function, *args, **kwargs):
        if (
            not args
            or not torch.is_tensor(args[0])
            or not args[0].is_floating_point()
            or not torch.is_grad_enabled()
            or torch.is_inference_mode_enabled()
            or is_recomputing()
        ):
            # A checkpointed layer nested in one being recomputed runs plainly: its input is already recomputed,
            # and a nested reload could pick the buffer the outer layer's backward still reads.
            return function(*args, **kwargs)
        hidden, rest = args[0], args[1:]
        if _needs_grad(rest) or _needs_grad(kwargs):
            # Other inputs that need gradients cannot go through this Function: plain recompute handles them.
            return recompute_checkpoint(function, *args, use_reentrant=False, **kwargs)

        layer = self._layer_module(function)
        if not hidden.requires_grad and layer is not None and not any(p.requires_grad for p in layer.parameters()):
            # A frozen layer on a frozen input (a vision encoder's block): nothing in it needs a gradient, so it
            # runs once with no graph. Through the Function (whose anchor makes every output require grad) it would
            # be recomputed and back-propagated in backward for nothing.
            return function(*args, **kwargs)
        run = LayerCall(function, rest, kwargs, layer)
        name = self.layer_names.get(id(layer)) or type(layer if layer is not None else function).__name__
        return _CheckpointedLayer.apply(self, run, hidden, self._anchor, name)

    def group_tokens_for(self, hidden: torch.Tensor) -> int:
        """Tokens per backward group for this layer input (0: back-propagate the layer whole)."""
        if self.group_tokens < 0:
            return auto_group_tokens(hidden.shape[-1])
        return self.group_tokens

    @staticmethod
    def _layer_module(function) -> torch.nn.Module | None:
        """The layer behind a call. transformers passes `partial(forward, layer, ...)` (latest) or
        `partial(<bound __call__ of the layer>, ...)` (5.17); tests may pass the layer itself."""
        layer = function
        if isinstance(function, functools.partial):
            first = function.args[0] if function.args else None
            layer = first if isinstance(first, torch.nn.Module) else getattr(function.func, "__self__", function)
        return layer if isinstance(layer, torch.nn.Module) else None

    # ---- saving in forward ----
    def save(self, hidden: torch.Tensor, layer: str = "") -> _SavedInput:
        self._seq += 1
        saved = _SavedInput(self._seq, hidden.shape, hidden.dtype, layer)
        if self.verify:
            saved.check = hidden.detach().clone(memory_format=torch.contiguous_format)
        while self._pending and self._pending[0]() is None:  # inputs of graphs dropped without a backward pass
            self._pending.pop(0)
        if not self.offloads or self._host_failed:
            saved.kept = hidden.detach()
            return saved
        if self._budget_pending:  # measured now: what the run holds in host memory by its first step is in use
            self._budget_pending = False
            available = available_system_memory()  # 0 where the system does not say: no budget then
            if available > 0:
                self.host.budget_bytes = offload_budget(available, processes_on_this_host())
        try:
            slot = self.host.acquire(saved.nbytes)
        except RuntimeError as e:  # pinned host memory ran out: keep inputs on the device from now on
            self._host_failed = True
            self._say(
                f"pinned host memory for layer inputs could not be allocated ({e}); they stay on the GPU "
                "(gpu checkpointing) for the rest of the run",
                "warning",
            )
            saved.kept = hidden.detach()
            return saved
        if slot is None:  # the host budget is reached: this input (a step's later layers) stays on the device
            if not self._budget_noted:
                self._budget_noted = True
                self._say(
                    f"the host memory budget for offloaded layer inputs ({size_text(self.host.budget_bytes or 0)}) "
                    f"is reached: the inputs of later layers stay on the GPU (layer {layer or saved.seq} first)",
                    "info",
                )
            self.kept_over_budget += 1
            saved.kept = hidden.detach()
            return saved
        self.copier.to_host(hidden.detach(), slot.view(saved.shape, saved.dtype))
        saved.slot = slot
        saved.give_back = weakref.finalize(saved, HostSlots.release, slot)
        self._pending.append(weakref.ref(saved))
        return saved

    # ---- reloading in backward ----
    def load(self, saved: _SavedInput) -> torch.Tensor:
        """The saved input on the device, ready for the compute stream (waits for its copy).

        The returned tensor is a view of a reload buffer (offload modes): the buffer is marked `reading`, and no copy
        goes into it until `release(saved)`, which the caller invokes once the layer's backward is queued.
        """
        if saved.kept is not None:
            self._verify(saved, saved.kept, "kept input")
            return saved.kept
        buffer = saved.buffer
        if buffer is None or buffer.owner != saved.seq or buffer.data is None or buffer.capacity < saved.nbytes:
            buffer = self._fill(saved, self._next_buffer(saved.nbytes, avoid=None))
        buffer.reading = True
        x = buffer.view(saved.shape, saved.dtype)  # taken now: a fallback during the prefetch may drop `buffer`
        if self.double:
            upcoming = self._previous_pending(saved)
            if upcoming is not None and not self._is_loaded(upcoming):
                target = self._next_buffer(upcoming.nbytes, avoid=buffer)
                if target is not None:
                    self._fill(upcoming, target)
        self.copier.wait(saved.ready)
        self._verify(saved, x, "reload buffer")
        return x

    def release(self, saved: _SavedInput) -> None:
        """After the layer's backward is queued: its buffer and host slot may take other inputs.

        Copies issued later into the buffer first wait for the compute stream's queued work (`CudaCopier`), which
        includes this layer's backward.
        """
        buffer = saved.buffer
        if buffer is not None and buffer.data is not None and buffer.owner == saved.seq:
            self._verify(saved, buffer.view(saved.shape, saved.dtype), "reload buffer after backward")
            buffer.owner, buffer.reading = -1, False
        if saved.give_back is not None:
            saved.give_back()
        self._pending = [ref for ref in self._pending if (s := ref()) is not None and s is not saved]

    @staticmethod
    def _is_loaded(saved: _SavedInput) -> bool:
        b = saved.buffer
        return b is not None and b.owner == saved.seq and b.data is not None

    def _previous_pending(self, saved: _SavedInput) -> _SavedInput | None:
        """The offloaded input saved just before `saved`: the next one backward will need."""
        found = False
        for ref in reversed(self._pending):
            s = ref()
            if s is None:
                continue
            if found:
                return s
            found = s is saved
        return None

    def _fill(self, saved: _SavedInput, buffer: ReloadBuffer | None) -> ReloadBuffer:
        if buffer is None or buffer.reading:
            raise RuntimeError(
                "internal error: no reload buffer free for a layer input (a buffer still being read "
                "would be overwritten)"
            )
        saved.ready = self.copier.to_device(
            saved.slot.view(saved.shape, saved.dtype), buffer.view(saved.shape, saved.dtype)
        )
        buffer.owner, saved.buffer = saved.seq, buffer
        return buffer

    def _verify(self, saved: _SavedInput, on_device: torch.Tensor, where: str) -> None:
        """With `verify`: compare what the recompute reads with the input as saved (and the host copy, once)."""
        if saved.check is None:
            return
        self.integrity.append(
            IntegrityCheck(saved.layer, saved.seq, where, _differing_bytes(on_device, saved.check), saved.nbytes)
        )
        if where == "reload buffer" and saved.slot is not None:
            # The compute stream has waited for the reload, and the comparison above made the host wait for the
            # compute stream: both copies through the slot are complete, the host may read it.
            host = saved.slot.view(saved.shape, saved.dtype)
            self.integrity.append(
                IntegrityCheck(
                    saved.layer, saved.seq, "pinned host copy", _differing_bytes(host, saved.check.cpu()), saved.nbytes
                )
            )

    def _next_buffer(self, nbytes: int, avoid: ReloadBuffer | None) -> ReloadBuffer | None:
        """The reload buffer the next copy goes into, allocated or grown to hold `nbytes`.

        Buffers are used in turn. With `avoid` (a prefetch while `avoid` is being read), only the other buffer will
        do, allocated on first use; None when there is no second buffer to be had (the run then has one buffer).
        """
        if avoid is None and not self.buffers:
            self._add_buffer(nbytes, second=False)
        if avoid is not None and len(self.buffers) < 2 and not self._add_buffer(nbytes, second=True):
            return None
        order = [(self._turn + k) % len(self.buffers) for k in range(len(self.buffers))]
        for index, buffer in [(i, self.buffers[i]) for i in order]:
            if buffer is avoid or buffer.data is None or buffer.reading:
                continue
            if buffer.capacity >= nbytes or self._grow(buffer, nbytes):
                self._turn = index + 1
                return buffer
        return None

    def _add_buffer(self, nbytes: int, second: bool) -> bool:
        if second:
            reason = second_buffer_decision(
                reload_buffer_bytes(nbytes),
                self.buffers[0].capacity,
                self.max_buffer_bytes,
                self._headroom(),
                HEADROOM_MARGIN_BYTES,
            )
            if reason is not None:
                self._fall_back(reason)
                return False
        try:
            data = allocate_reload_buffer(self.device, nbytes, self.copier)
        except torch.OutOfMemoryError:
            if not second:
                raise
            self._fall_back("the GPU had no room for a second reload buffer")
            return False
        self.buffers.append(ReloadBuffer(data))
        return True

    def _grow(self, buffer: ReloadBuffer, nbytes: int) -> bool:
        """Reallocate `buffer` for a bigger input. The second buffer gives way (fallback) when it does not fit."""
        second = len(self.buffers) > 1 and buffer is self.buffers[1]
        if second:
            reason = second_buffer_decision(
                reload_buffer_bytes(nbytes),
                self.buffers[0].capacity,
                self.max_buffer_bytes,
                self._headroom(buffer.capacity),
                HEADROOM_MARGIN_BYTES,
            )
            if reason is not None:
                self._fall_back(reason)
                return False
        buffer.data, buffer.owner = None, -1  # the allocator reuses it once its queued readers are done
        try:
            buffer.data = allocate_reload_buffer(self.device, nbytes, self.copier)
        except torch.OutOfMemoryError:
            if second:
                self._fall_back("the GPU had no room to grow the second reload buffer")
                return False
            if not self.double or len(self.buffers) < 2:
                raise
            self._fall_back("the GPU had no room to grow the reload buffers")
            buffer.data = allocate_reload_buffer(self.device, nbytes, self.copier)
        return True

    def _headroom(self, returned: int = 0) -> int | None:
        """Device memory this process could still allocate (plus `returned` bytes about to be freed)."""
        if not self.cuda:
            return None
        free, _total = torch.cuda.mem_get_info(self.device)
        cached = torch.cuda.memory_reserved(self.device) - torch.cuda.memory_allocated(self.device)
        return free + cached + returned

    def _fall_back(self, reason: str) -> None:
        if not self.double:
            return
        self.double = False
        if len(self.buffers) > 1:
            dropped = self.buffers.pop(1)
            dropped.data, dropped.owner = None, -1
        self._say(
            f"offload-double falls back to one reload buffer: {reason}. Steps lose the copy/compute "
            "overlap (copies are no longer hidden)",
            "warning",
        )

    def _say(self, message: str, level: str) -> None:
        self.notes.append(message)
        if self._note is not None:
            self._note("checkpoint", message, level)

    # ---- per step ----
    def read_and_reset(self) -> dict:
        """The StepMetrics fields of the step just finished: offload_bytes, copy_stall_s, buffer_bytes.

        Call after the step's work is synchronized (the trainer does); then nothing here waits for the GPU. Also
        gives up the second buffer when the step's peak left less than `HEADROOM_MARGIN_BYTES` free.
        """
        out = dict(
            offload_bytes=self.copier.counters.offload_bytes,
            copy_stall_s=self.copier.read_stall_s(),
            buffer_bytes=self.buffer_bytes,
        )
        self.copier.counters.offload_bytes = 0
        self.kept_over_budget = 0
        if self.cuda and self.double and len(self.buffers) > 1:
            free, _total = torch.cuda.mem_get_info(self.device)
            reason = tight_memory_reason(
                free,
                torch.cuda.memory_reserved(self.device),
                torch.cuda.max_memory_allocated(self.device),
                HEADROOM_MARGIN_BYTES,
            )
            if reason is not None:
                self._fall_back(reason)
        return out


# ---------------------------------------------------------------------------------------------------------------
# Installing it
# ---------------------------------------------------------------------------------------------------------------

_UNSET = object()


def _base_model(model):
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def decoder_layers(model) -> list[torch.nn.Module]:
    """The modules transformers checkpoints (its `GradientCheckpointingLayer`s: decoder layers, vision blocks)."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    return [m for m in _base_model(model).modules() if isinstance(m, GradientCheckpointingLayer)]


def apply_checkpointing(
    model,
    mode: str,
    device,
    *,
    max_buffer_bytes: int | None = None,
    note=None,
    streams=None,
    verify: bool = False,
    group_tokens: int = 0,
    kept_layers: int = 0,
) -> Checkpointer | None:
    """Checkpoint every decoder layer of `model` (a transformers model, possibly peft-wrapped) in `mode`, but the
    last `kept_layers` (speed.keep_layer_activations): those run plainly and keep every activation for backward.

    transformers decoder layers are `GradientCheckpointingLayer`s that, when their `gradient_checkpointing` flag is
    set, call `self._gradient_checkpointing_func(layer_call, hidden_states)` with every other argument (attention
    mask, position-embedding tuple, `cu_seq_lens_q/k`, `max_length_q/k`, ...) bound into `layer_call`. This sets
    those two attributes on every such layer, to one `Checkpointer`; `revert_checkpointing` restores what was there.
    It works the same under peft LoRA / QLoRA (peft swaps the linear modules inside a layer, not the layer) and for
    MoE layers.

    `max_buffer_bytes`, `note`, `streams`, `verify` and `group_tokens` are passed to the `Checkpointer`.

    Returns:
        The Checkpointer (read it once per step with `read_and_reset`), or None when the model has no layer
        transformers can checkpoint (a Notice says so; the run goes on without checkpointing).
    """
    base = _base_model(model)
    revert_checkpointing(model)
    layers = decoder_layers(base)
    if not layers:
        if note is not None:
            note(
                "checkpoint",
                f"{type(base).__name__} has no decoder layers transformers can checkpoint; activation "
                "checkpointing is off for this run",
                "warning",
            )
        return None
    checkpointer = Checkpointer(
        mode,
        device,
        max_buffer_bytes=max_buffer_bytes,
        note=note,
        streams=streams,
        verify=verify,
        group_tokens=group_tokens,
    )
    ids = {id(layer) for layer in layers}
    checkpointer.layer_names = {id(m): name for name, m in base.named_modules() if id(m) in ids}
    previous = [
        (
            layer,
            layer.__dict__.get("gradient_checkpointing", _UNSET),
            layer.__dict__.get("_gradient_checkpointing_func", _UNSET),
        )
        for layer in layers
    ]
    # The last layers are the ones kept: their activations are made last and back-propagated first, so they are
    # freed before any checkpointed layer is recomputed (the planner's `kept_layers`).
    checkpointer.kept_layers = min(max(0, kept_layers), len(layers))
    checkpointer._layers = [weakref.ref(layer) for layer in layers]
    recomputed = len(layers) - checkpointer.kept_layers
    for index, layer in enumerate(layers):
        layer.gradient_checkpointing = index < recomputed
        layer._gradient_checkpointing_func = checkpointer
    config = getattr(base, "config", None)
    use_cache = getattr(config, "use_cache", _UNSET)
    if config is not None and use_cache is not _UNSET:
        config.use_cache = False  # a cache written in forward would be written again by the recompute
    base._hone_checkpointing = (checkpointer, previous, use_cache)
    return checkpointer


def revert_checkpointing(model) -> None:
    """Undo `apply_checkpointing`: every layer's checkpoint flag and function are what they were before."""
    base = _base_model(model)
    state = base.__dict__.pop("_hone_checkpointing", None)
    if state is None:
        return
    _checkpointer, previous, use_cache = state
    for layer, flag, func in previous:
        for name, value in (("gradient_checkpointing", flag), ("_gradient_checkpointing_func", func)):
            if value is _UNSET:
                layer.__dict__.pop(name, None)
            else:
                setattr(layer, name, value)
    if use_cache is not _UNSET:
        base.config.use_cache = use_cache
