"""Step anatomy: every operation of one training step with its FLOPs, bytes moved and live memory, on no GPU.

The step runs on the `meta` device (shapes, no data) under `StepAnatomy`, a dispatch mode that sees each aten
operation: FLOPs of the matmul-like ones, bytes read and written of all, every allocation and free (so the peak of
live memory is that of the trainer's own code at the real shape). A roofline turns the counts into a predicted time
per operation: max(FLOPs / matmul rate, bytes / memory bandwidth) plus a fixed cost per kernel. `step_plan` runs a
whole step under it (`python -m hone.core.bench.meta_device.step_plan` prints the tables).
"""

from __future__ import annotations

import contextlib
import re
import weakref
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.flop_counter import flop_registry

aten = torch.ops.aten

# Roofline constants for an H200 in bf16. Matmul rate: what `hone bench` measured on it (741 TFLOP/s for an
# 8192^3 product). Large dense GEMMs reach ~75% of that inside a training step (shape and wave quantization);
# grouped GEMMs over ~512-row expert groups ~60%. Memory: 4.8 TB/s peak, ~3.6 TB/s for streaming kernels.
# A kernel costs at least ~4 us (launch, tail of the previous kernel, a few waves).
H200_MATMUL_FLOPS = 741e12
DENSE_EFFICIENCY = 0.75
GROUPED_EFFICIENCY = 0.6
H200_BYTES_PER_S = 3.6e12
KERNEL_FLOOR_S = 4e-6

# Operations that only re-describe memory (no kernel, no traffic) or only allocate it.
_ALIAS_OPS = {
    "view",
    "_unsafe_view",
    "reshape",
    "transpose",
    "t",
    "permute",
    "expand",
    "unsqueeze",
    "squeeze",
    "slice",
    "select",
    "as_strided",
    "alias",
    "detach",
    "split",
    "split_with_sizes",
    "chunk",
    "unbind",
    "view_as",
    "unflatten",
    "flatten",
    "narrow",
    "diagonal",
    "_reshape_alias",
    "lift_fresh",
    "movedim",
    "view_as_real",
    "view_as_complex",
    "_local_scalar_dense",
}
_ALLOC_OPS = {"empty", "empty_like", "new_empty", "empty_strided", "new_empty_strided", "empty_permuted"}


@dataclass
class OpRecord:
    """One operation of the step.

    Attributes:
        op: aten name (or a Triton launcher's name).
        phase: forward | recompute | backward | loss | clip | optimizer | zero_grad.
        component: what part of the model it belongs to (see `component_of`).
        flops: multiply-adds x 2 (0 for non-matmul work).
        bytes: bytes read + written.
        grouped: a grouped GEMM (lower efficiency in the roofline).
        kernels: kernel launches (0 for views and bare allocations).
        module: the qualified name of the module it ran in ("" outside any).
    """

    op: str
    phase: str
    component: str
    flops: float
    bytes: float
    grouped: bool = False
    kernels: int = 1
    module: str = ""

    def seconds(self, matmul_flops: float = H200_MATMUL_FLOPS, bytes_per_s: float = H200_BYTES_PER_S) -> float:
        """Roofline time of this operation (0 for views and bare allocations)."""
        if not self.kernels:
            return 0.0
        efficiency = GROUPED_EFFICIENCY if self.grouped else DENSE_EFFICIENCY
        compute = self.flops / (matmul_flops * efficiency) if self.flops else 0.0
        return max(compute, self.bytes / bytes_per_s) + KERNEL_FLOOR_S * self.kernels


_ACTIVE: list[StepAnatomy] = []


def record_kernel(
    op: str, *, flops: float, bytes_moved: float, grouped: bool = False, component: str | None = None
) -> None:
    """Report a Triton kernel's cost to the anatomy being recorded (no-op when none is)."""
    if _ACTIVE:
        _ACTIVE[-1].add(op, flops, bytes_moved, grouped=grouped, component=component)


def _tensor_bytes(t: torch.Tensor) -> int:
    """Bytes an operation touches for `t`: its elements, at most its storage (broadcast views read less)."""
    try:
        storage = t.untyped_storage().nbytes()
    except (RuntimeError, NotImplementedError):
        storage = t.numel() * t.element_size()
    return min(t.numel() * t.element_size(), storage)


class ModuleLabels:
    """Which module an operation belongs to, in forward, recompute and backward.

    Forward (and checkpoint recompute): a stack kept by global module hooks; the innermost module running wins.
    Backward: when a module's forward returns, every autograd node its outputs were made by that carries no label
    yet gets the module's name in `node.metadata`; the engine's current node then names the module whose
    backward is running (custom Functions, e.g. the experts' grouped GEMMs, included).

    Args:
        model: the model whose module names are used (other modules keep their class name).
    """

    KEY = "hone_module"

    def __init__(self, model: torch.nn.Module):
        self.names = {id(m): name for name, m in model.named_modules()}
        self.stack: list[str] = []
        self._handles: list = []

    def _name(self, module: torch.nn.Module) -> str:
        return self.names.get(id(module), type(module).__name__)

    def _pre(self, module, args) -> None:
        self.stack.append(self._name(module))

    def _post(self, module, args, output) -> None:
        name = self.stack.pop() if self.stack else self._name(module)
        todo = [t.grad_fn for t in tree_flatten(output)[0] if isinstance(t, torch.Tensor) and t.grad_fn is not None]
        while todo:
            node = todo.pop()
            if node is None or self.KEY in node.metadata:
                continue
            node.metadata[self.KEY] = name
            todo.extend(next_node for next_node, _ in node.next_functions)

    def current(self) -> str:
        if self.stack:
            return self.stack[-1]
        node = torch._C._current_autograd_node()
        if node is not None:
            return node.metadata.get(self.KEY, "")
        return ""

    def __enter__(self) -> ModuleLabels:
        from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook

        self._handles = [register_module_forward_pre_hook(self._pre), register_module_forward_hook(self._post)]
        return self

    def __exit__(self, *exc) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []


class StepAnatomy(TorchDispatchMode):
    """Records every aten operation (see the module docstring); with `ModuleLabels`, by component.

    What it does not see: Triton kernels launch no aten operation, so Hone's grouped GEMM and cross-entropy
    launchers report their own costs through `record_kernel` (they are the only ones on the MoE path); fused norm /
    rope / LoRA kernels are CUDA-only and a plan runs their torch references (a few more elementwise passes than the
    GPU run); the CUDA caching allocator rounds blocks up (a few MiB over the peak here); host-side overheads
    (Python, launch latency beyond the fixed per-kernel cost) are not modelled and show up as the gap between a
    measured step and the prediction.

    Attributes:
        records: OpRecord per operation, in order.
        live_bytes: bytes of storages allocated since the start and not yet freed.
        peak_bytes: the highest `live_bytes` (per `reset_peak` window).
        phase_peaks: the highest `live_bytes` seen in each phase.
        peak_live: (bytes, description) of every tensor alive at the peak (allocated since the start).
    """

    def __init__(
        self,
        labels: ModuleLabels | None = None,
        attention_flops: Callable[[str], float] | None = None,
        lora_width: int = 64,
    ):
        super().__init__()
        self.lora_width = lora_width  # a grouped product with a side this narrow is a LoRA factor product
        self.labels = labels
        self.attention_flops = attention_flops
        self.records: list[OpRecord] = []
        self.live_bytes = 0
        self.peak_bytes = 0
        self.phase_peaks: dict[str, int] = defaultdict(int)
        self.region: str | None = None
        self._storages: dict[int, tuple[int, str]] = {}
        self.peak_live: list[tuple[int, str]] = []
        self._before: set[int] = set()
        self._refs: list = []

    # ---- phases and components ----
    def phase(self) -> str:
        if self.region is not None:
            return self.region
        from hone.core.speed.checkpointing.layer_recompute import is_recomputing

        if is_recomputing():
            return "recompute"
        return "backward" if torch._C._current_graph_task_id() != -1 else "forward"

    def module_path(self) -> str:
        return self.labels.current() if self.labels is not None else ""

    @contextlib.contextmanager
    def labelled(self, region: str) -> Iterator[None]:
        """Attribute everything inside to `region` (loss, clip, optimizer, zero_grad)."""
        previous, self.region = self.region, region
        try:
            yield
        finally:
            self.region = previous

    def reset_peak(self) -> None:
        """Start a new peak window; tensors alive now are left out of `peak_live`."""
        self.peak_bytes = self.live_bytes
        self.phase_peaks = defaultdict(int)
        self.peak_live = []
        self._before = set(self._storages)

    # ---- memory ----
    def _track(self, t: torch.Tensor, op: str) -> None:
        storage = t.untyped_storage()
        key = id(storage)
        if key in self._storages:
            return
        size = storage.nbytes()
        phase = self.phase()
        self._storages[key] = (
            size,
            f"{phase} {op} {tuple(t.shape)} {str(t.dtype).removeprefix('torch.')} {self.module_path()}",
        )
        self.live_bytes += size
        if self.live_bytes > self.peak_bytes:
            self.peak_bytes = self.live_bytes
            self.peak_live = [entry for key, entry in self._storages.items() if key not in self._before]
        self.phase_peaks[phase] = max(self.phase_peaks[phase], self.live_bytes)
        self._refs.append(weakref.ref(storage, lambda _ref, k=key: self._free(k)))

    def _free(self, key: int) -> None:
        size, _ = self._storages.pop(key, (0, ""))
        self.live_bytes -= size

    # ---- records ----
    def add(
        self,
        op: str,
        flops: float,
        bytes_moved: float,
        *,
        grouped: bool = False,
        kernels: int = 1,
        component: str | None = None,
    ) -> None:
        phase, module = self.phase(), self.module_path()
        if component is None:
            component = component_of(op, module, phase, flops, grouped)
        self.records.append(OpRecord(op, phase, component, float(flops), float(bytes_moved), grouped, kernels, module))

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        name = func.__name__.split(".")[0]
        outs = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
        ins = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        in_ids = {id(t.untyped_storage()) for t in ins}
        fresh = [t for t in outs if id(t.untyped_storage()) not in in_ids]
        for t in fresh:
            self._track(t, name)
        if name in _ALIAS_OPS or (outs and not fresh and not func._schema.is_mutable):
            return out  # a view of its input: no kernel, no traffic
        if name in _ALLOC_OPS:
            self.add(name, 0, 0, kernels=0)
            return out
        flops = 0.0
        grouped = False
        component = None
        if name in ("_grouped_mm", "grouped_mm"):
            flops, grouped = _grouped_mm_flops(args), True
            narrow = _is_lora_product(args[0], args[1], self.lora_width)
            component = "experts LoRA GEMMs" if narrow else "experts GEMMs"
        elif func.overloadpacket in flop_registry:
            try:
                flops = flop_registry[func.overloadpacket](*args, **kwargs, out_val=out)
            except Exception:  # formulas that read values (varlen lengths) cannot run on meta tensors
                flops = 0.0
        if "attn" in name and self.attention_flops is not None:
            flops = self.attention_flops(name)
        seen: set[int] = set()
        moved = 0
        for t in ins + outs:
            if id(t) not in seen:
                seen.add(id(t))
                moved += _tensor_bytes(t)
        self.add(name, flops, moved, grouped=grouped, component=component)
        return out


def _grouped_mm_flops(args) -> float:
    """2 x M x K x N summed over groups: (S, K) @ (E, K, N), or (M, S) @ (S, N) reduced per group."""
    a, b = args[0], args[1]
    if a.dim() == 2 and b.dim() == 3:
        return 2.0 * a.shape[0] * a.shape[1] * b.shape[2]
    if a.dim() == 2 and b.dim() == 2:
        return 2.0 * a.shape[0] * a.shape[1] * b.shape[1]
    return 2.0 * a.numel() * b.shape[-1]


def component_of(op: str, module: str, phase: str, flops: float, grouped: bool) -> str:
    """A readable component name from the op and the module running it."""
    if phase in ("loss", "clip", "optimizer", "zero_grad"):
        if phase == "loss":
            return "LM head GEMMs" if flops else "loss elementwise"
        return {"clip": "grad clipping", "optimizer": "optimizer", "zero_grad": "zero_grad"}[phase]
    path = module.lower()
    if re.search(r"\.experts(\.|$)", path):
        if op in ("sort", "searchsorted", "div", "arange", "cumsum"):
            return "routing"
        return "experts LoRA GEMMs" if flops else "experts elementwise / gather / scatter"
    if "attn" in op:
        return "attention core"
    if "self_attn" in path:
        if "lora" in path:
            return "attention LoRA"
        if flops:
            return "attention projections"
        return "attention elementwise"
    if ".mlp.gate" in path:
        return "router"
    if ".mlp" in path:
        return "MoE block glue"
    if "norm" in path:
        return "norms"
    if "embed" in path:
        return "embedding"
    return "other"


def _is_lora_product(a: torch.Tensor, b: torch.Tensor, width: int) -> bool:
    """Whether a grouped product involves a LoRA factor: one side (K or N of a forward product, M or N of a
    weight-gradient product) as narrow as a LoRA rank (`width`: the largest rank in the model)."""
    if b.dim() == 3:
        return min(a.shape[-1], b.shape[-1]) <= width
    return min(a.shape[0], b.shape[-1]) <= width


# ---- summaries ------------------------------------------------------------------------------------------------


@dataclass
class Summary:
    """Totals of a set of records."""

    flops: float = 0.0
    bytes: float = 0.0
    kernels: int = 0
    seconds: float = 0.0
    by: dict = field(default_factory=dict)


def summarize(records: list[OpRecord], key: Callable[[OpRecord], str]) -> dict[str, Summary]:
    """Totals per key (e.g. `lambda r: r.component`), largest predicted time first."""
    totals: dict[str, Summary] = defaultdict(Summary)
    for r in records:
        s = totals[key(r)]
        s.flops += r.flops
        s.bytes += r.bytes
        s.kernels += r.kernels
        s.seconds += r.seconds()
    return dict(sorted(totals.items(), key=lambda kv: -kv[1].seconds))


def causal_attention_flops(lengths: list[int], heads: int, head_dim: int) -> tuple[float, float]:
    """(forward, backward) FLOPs of causal attention over packed sequences: QK^T and PV over the lower triangle;
    a flash backward does 2.5 forwards' worth of matmuls (it recomputes the scores)."""
    pairs = sum(n * (n + 1) / 2 for n in lengths)
    forward = 2 * 2 * pairs * heads * head_dim
    return forward, 2.5 * forward
