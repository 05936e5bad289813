"""One training step under `torch.profiler` (`hone bench --profile`): which kernels take the GPU's time, and where
they were launched.

`profile_step(runner, "cuda")`, after the run's timed steps, profiles one more step and summarizes it: the top
kernels by total device time with call counts, the same time by where each kernel was launched (`launch_group`:
forward / recompute of a module, backward of an autograd node, optimizer, other), by phase and by category, and the
matmuls by their operands' shapes with the rate each reached (a slow shape: a GEMM cuBLAS cannot run on its fastest
kernels). On a CPU there are no device kernels: each ATen op's own time stands in for one, so the tables can be
checked there.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from functools import partial

import torch
from torch.autograd import DeviceType

MODULE_RANGE = "hone.module::"
_NODE_RANGE = "autograd::engine::evaluate_function: "
_OPTIMIZER_RANGE = "Optimizer."
# Kernel name fragments -> category, first match wins (flash attention, cuBLAS/CUTLASS GEMMs, copies, ATen's
# reduction and elementwise templates). Attention comes first: its kernels are built from CUTLASS and wgmma too
# (`pytorch_flash::flash_fwd_kernel<...cutlass::bfloat16_t...>`, `cudnn_..._sdpa_sm90_flash_bprop_wgmma_...`).
# Triton kernels are recognized by name shape in `kernel_category`.
_CATEGORIES = (
    ("attention", ("flash", "fmha", "attention", "sdpa")),
    ("matmul", ("gemm", "cutlass", "nvjet", "xmma", "cublas", "wgmma", "s16816", "splitk")),
    ("copy", ("memcpy", "memset", "copy_kernel")),
    ("reduction", ("reduce", "softmax", "logsumexp", "cross_entropy")),
    ("elementwise", ("elementwise", "foreach", "fill", "index", "scatter", "gather", "cat")),
)


def module_label(name: str) -> str:
    """Short, layer-independent name for a module path: the part after the last layer index, else the last two
    parts ("base_model.model.model.layers.3.self_attn.q_proj.lora_A.default" -> "self_attn.q_proj.lora_A")."""
    parts = [p for p in name.split(".") if p and p != "default"]
    indices = [i for i, p in enumerate(parts) if p.isdigit()]
    if indices:
        last = indices[-1]
        return ".".join(parts[last + 1 :]) or "decoder layer"
    return ".".join(parts[-2:]) or "model"


def kernel_category(name: str) -> str:
    """matmul, attention, copy, triton (inductor's `triton_*`, Hone's `_*_kernel`), reduction, elementwise, other."""
    lowered = name.lower()
    for category, fragments in _CATEGORIES[:3]:
        if any(f in lowered for f in fragments):
            return category
    if lowered.startswith("triton") or (lowered.startswith("_") and lowered.endswith("_kernel")):
        return "triton"
    for category, fragments in _CATEGORIES[3:]:
        if any(f in lowered for f in fragments):
            return category
    return "other"


class ModuleRanges:
    """`record_function` ranges around every module's forward while installed; `remove()` takes them off."""

    def __init__(self, model: torch.nn.Module):
        self._local = threading.local()  # backward (and so recompute) runs on the autograd engine's threads
        self._handles = []
        for name, module in model.named_modules():
            label = MODULE_RANGE + module_label(name)
            self._handles.append(module.register_forward_pre_hook(partial(self._enter, label)))
            self._handles.append(module.register_forward_hook(self._exit, always_call=True))

    def _stack(self) -> list:
        if not hasattr(self._local, "stack"):
            self._local.stack = []
        return self._local.stack

    def _enter(self, label: str, _module, _args) -> None:
        scope = torch.autograd.profiler.record_function(label)
        scope.__enter__()
        self._stack().append(scope)

    def _exit(self, _module, _args, _output) -> None:
        stack = self._stack()
        if stack:
            stack.pop().__exit__(None, None, None)

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []


def _compiled(model: torch.nn.Module) -> bool:
    return any(getattr(m, "_compiled_call_impl", None) is not None for m in model.modules())


def launch_group(event) -> str:
    """Where the CPU op `event` ran, read from the ranges around it, innermost first.

    - every module of the model gets a `record_function` range while its forward runs (forward hooks, removed
      afterwards), named after its path with the layer index dropped (`self_attn.q_proj.base_layer`, `mlp`,
      `model.norm`): a kernel inside one is "forward <module>", or "recompute <module>" when the module ran inside
      an autograd node (a checkpointed layer recomputed in backward);
    - the autograd engine wraps each backward node in a range of its own: "backward <node>" (e.g.
      `LoRALinearFunctionBackward`);
    - `Optimizer.step` / `zero_grad` ranges: "optimizer";
    - anything else: "other <outermost range or op>" (e.g. the chunked loss's `_LinearHeadLoss`, gradient clipping).
    Blocks compiled with `torch.compile` get no module ranges (new hooks would make dynamo recompile inside the
    profiled step); their kernels are grouped by autograd node and range only.
    """
    chain = []
    while event is not None:
        chain.append(event.name)
        event = event.cpu_parent
    module = node = None
    for depth, name in enumerate(chain):
        if name.startswith(_OPTIMIZER_RANGE):
            return "optimizer"
        if module is None and name.startswith(MODULE_RANGE):
            module = (depth, name[len(MODULE_RANGE) :])
        elif node is None and name.startswith(_NODE_RANGE):
            node = (depth, name[len(_NODE_RANGE) :])
    if module is not None and (node is None or module[0] < node[0]):
        return ("recompute " if node is not None else "forward ") + module[1]
    if node is not None:
        return "backward " + node[1]
    return "other " + chain[-1]


def _launches(events, cuda: bool):
    """(kernel name, microseconds, launching CPU event) for every device kernel linked to a CPU op; on a CPU,
    every ATen op with its own (self) time."""
    for event in events:
        if event.device_type != DeviceType.CPU:
            continue
        if cuda:
            for kernel in event.kernels:
                yield kernel.name, float(kernel.duration), event
        elif event.name.startswith("aten::"):
            yield event.name, float(event.self_cpu_time_total), event


# ATen ops that are one GEMM (or a batch of them); on a CPU their own time stands in for a matmul kernel.
_MATMUL_OPS = frozenset(
    {
        "aten::mm",
        "aten::addmm",
        "aten::addmm_",
        "aten::bmm",
        "aten::baddbmm",
        "aten::baddbmm_",
        "aten::_grouped_mm",
        "aten::_scaled_mm",
    }
)


def matmul_flops(op: str, shapes) -> int:
    """FLOPs of one call of the GEMM op `op` from its recorded input shapes (0 where they do not say: grouped GEMMs,
    whose group sizes are data)."""
    operands = [list(s) for s in shapes or [] if s]
    if op.startswith(("aten::addmm", "aten::baddbmm")):
        operands = operands[1:]  # the added input comes first
    if op in ("aten::_grouped_mm", "aten::_scaled_mm") or len(operands) < 2:
        return 0
    a, b = operands[0], operands[1]
    if len(a) == 2 and len(b) == 2:
        return 2 * a[0] * a[1] * b[1]
    if len(a) == 3 and len(b) == 3:
        return 2 * a[0] * a[1] * a[2] * b[2]
    return 0


def _matmul_table(launches, top: int) -> list[dict]:
    """(op, shapes, kernel, us, group) launches -> rows by (op, shapes), the most time first: calls, total_ms,
    flops, tflops, the kernel and the launch group that took most of the row's time."""
    rows: dict = {}
    for op, shapes, kernel, us, group in launches:
        row = rows.setdefault(
            (op, str(shapes)),
            {
                "op": op,
                "shapes": shapes,
                "calls": 0,
                "us": 0.0,
                "kernels": defaultdict(float),
                "groups": defaultdict(float),
            },
        )
        row["calls"] += 1
        row["us"] += us
        row["kernels"][kernel] += us
        row["groups"][group] += us
    out = []
    for row in sorted(rows.values(), key=lambda r: r["us"], reverse=True)[:top]:
        flops = row["calls"] * matmul_flops(row["op"], row["shapes"])
        out.append(
            {
                "op": row["op"],
                "shapes": row["shapes"],
                "calls": row["calls"],
                "total_ms": row["us"] / 1000,
                "flops": flops,
                "tflops": flops / row["us"] / 1e6 if row["us"] else 0.0,
                "kernel": max(row["kernels"].items(), key=lambda kv: kv[1])[0],
                "where": max(row["groups"].items(), key=lambda kv: kv[1])[0],
            }
        )
    return out


def _table(totals: dict, counts: dict, whole_us: float, top: int) -> list[dict]:
    rows = sorted(totals.items(), key=lambda kv: kv[1], reverse=True)[:top]
    return [
        {"name": name, "calls": counts[name], "total_ms": us / 1000, "share": us / whole_us if whole_us else 0.0}
        for name, us in rows
    ]


def summarize(events, *, cuda: bool, wall_s: float, top: int = 25) -> dict:
    """Tables of one profiled step from `prof.events()`.

    Returns:
        dict: wall_ms (the step, synchronized), device_ms (sum of kernel times: more than wall_ms when streams
        overlap, less when the GPU idles), attributed_ms (the part linked to a CPU op), kernel_launches,
        kernels / groups (top `top` rows: name, calls, total_ms, share of device_ms), phases (forward, recompute,
        backward, optimizer, other) and categories (matmul, attention, triton, ...) as name -> ms, and matmuls
        (top `top` rows by op and operand shapes: calls, total_ms, flops, tflops, kernel, where; see
        `_matmul_table`; shapes need the profiler's `record_shapes`).
    """
    kernel_us, kernel_calls = defaultdict(float), defaultdict(int)
    if cuda:  # every device activity, linked to a CPU op or not (copies on side streams, for instance)
        for event in events:
            if event.device_type == DeviceType.CUDA and not _annotation(event):
                kernel_us[event.name] += event.time_range.elapsed_us()
                kernel_calls[event.name] += 1
    group_us, group_calls = defaultdict(float), defaultdict(int)
    phases, categories = defaultdict(float), defaultdict(float)
    attributed = 0.0
    matmuls = []
    for name, us, event in _launches(events, cuda):
        if not cuda:
            kernel_us[name] += us
            kernel_calls[name] += 1
        group = launch_group(event)
        shapes = [list(s) for s in getattr(event, "input_shapes", None) or []]
        if shapes and ((kernel_category(name) == "matmul") if cuda else name in _MATMUL_OPS):
            matmuls.append((event.name, shapes, name, us, group))
        group_us[group] += us
        group_calls[group] += 1
        phases[group.split(" ", 1)[0]] += us / 1000
        attributed += us
    for name, us in kernel_us.items():
        categories[kernel_category(name)] += us / 1000
    device_us = sum(kernel_us.values())
    waits = defaultdict(lambda: [0, 0.0])  # CUDA runtime calls that block the host: calls, ms
    for event in events:
        if event.name in _HOST_WAITS:
            waits[event.name][0] += 1
            waits[event.name][1] += event.time_range.elapsed_us() / 1000
    return {
        "wall_ms": wall_s * 1000,
        "device_ms": device_us / 1000,
        "attributed_ms": attributed / 1000,
        "host_waits": {name: {"calls": calls, "ms": ms} for name, (calls, ms) in waits.items()},
        "kernel_launches": sum(kernel_calls.values()),
        "device": "cuda" if cuda else "cpu (ATen ops)",
        "kernels": _table(kernel_us, kernel_calls, device_us, top),
        "groups": _table(group_us, group_calls, device_us, top),
        "phases": dict(sorted(phases.items(), key=lambda kv: -kv[1])),
        "categories": dict(sorted(categories.items(), key=lambda kv: -kv[1])),
        "matmuls": _matmul_table(matmuls, top),
    }


def _annotation(event) -> bool:
    """A `record_function` range as the profiler also shows it on the GPU's timeline (the module ranges above):
    it spans kernels, it is none."""
    return bool(getattr(event, "is_user_annotation", False)) or event.name.startswith(MODULE_RANGE)


# CUDA runtime calls that can make the host wait for the device (the step's own final synchronize is one).
_HOST_WAITS = frozenset(
    {"cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy", "cudaFree", "cudaMalloc"}
)


class StepProfile:
    """The profiler around one step that something else runs (Hone's Trainer in the vision benchmark): `start()`
    just before the step, `stop()` right after it, then `summary` (see `summarize`)."""

    def __init__(self, model: torch.nn.Module | None, device: str, *, top: int = 25):
        self.cuda = torch.device(device).type == "cuda"
        self.model, self.top = model, top
        self.summary: dict | None = None
        self._ranges = self._profiler = None
        self._started = 0.0

    def start(self) -> None:
        activities = [torch.profiler.ProfilerActivity.CPU]
        if self.cuda:
            activities.append(torch.profiler.ProfilerActivity.CUDA)
            torch.cuda.synchronize()
        compiled = self.model is not None and _compiled(self.model)
        self._ranges = ModuleRanges(self.model) if self.model is not None and not compiled else None
        self._profiler = torch.profiler.profile(activities=activities, record_shapes=True)  # the matmul table
        self._profiler.__enter__()
        self._started = time.perf_counter()

    def stop(self) -> None:
        try:
            if self.cuda:
                torch.cuda.synchronize()
            wall = time.perf_counter() - self._started
            self._profiler.__exit__(None, None, None)
        finally:
            if self._ranges is not None:
                self._ranges.remove()
        self.summary = summarize(self._profiler.events(), cuda=self.cuda, wall_s=wall, top=self.top)
        self.summary["note"] = (
            ""
            if self._ranges is not None or self.model is None
            else ("compiled blocks: no module ranges (grouped by autograd node and range only)")
        )


def profile_step(runner, device: str, *, top: int = 25) -> dict:
    """Run one more optimizer step of a set-up runner under the profiler and summarize it (see `summarize`).

    The module ranges are installed for this step only and removed afterwards, even when the step fails.
    """
    profile = StepProfile(getattr(runner, "model", None), device, top=top)
    profile.start()
    try:
        runner.step()
    finally:
        profile.stop()
    return profile.summary


def profile_tables(name: str, summary: dict):
    """Rich renderables for one run's profile: a heading line, the top kernels, and the launch groups."""
    from rich.table import Table

    if "error" in summary:
        return [f"profile of {name}: failed: {summary['error']}"]
    device_ms = summary["device_ms"]
    head = (
        f"profile of {name}: one step {summary['wall_ms']:.1f} ms wall, {device_ms:.1f} ms in "
        f"{summary['kernel_launches']:,} {summary['device']} kernels; by phase: "
        + ", ".join(f"{k} {v:.1f} ms" for k, v in summary["phases"].items())
        + "; by kind: "
        + ", ".join(f"{k} {v:.1f} ms" for k, v in summary["categories"].items())
    )
    if summary.get("host_waits"):
        head += "; CUDA runtime calls: " + ", ".join(
            f"{k} {v['calls']} x {v['ms']:.1f} ms" for k, v in summary["host_waits"].items()
        )
    if summary.get("note"):
        head += f" ({summary['note']})"
    out = [head]
    for title, rows, width in (("top kernels", summary["kernels"], 90), ("launched from", summary["groups"], 70)):
        table = Table(title=f"{name}: {title}", title_justify="left")
        table.add_column("name", overflow="fold", max_width=width)
        for column in ("calls", "total ms", "% device"):
            table.add_column(column, justify="right")
        for row in rows:
            table.add_row(row["name"], f"{row['calls']:,}", f"{row['total_ms']:.2f}", f"{100 * row['share']:.1f}")
        out.append(table)
    if summary.get("matmuls"):
        out.append(_matmul_rich_table(name, summary["matmuls"]))
    return out


def _matmul_rich_table(name: str, rows: list[dict]):
    from rich.table import Table

    table = Table(title=f"{name}: matmuls by operand shapes", title_justify="left")
    table.add_column("op and shapes", overflow="fold", max_width=44)
    table.add_column("kernel", overflow="fold", max_width=48)
    table.add_column("where", overflow="fold", max_width=36)
    for column in ("calls", "total ms", "TFLOP/s"):
        table.add_column(column, justify="right")
    for row in rows:
        shapes = " x ".join(str(tuple(s)) for s in row["shapes"])
        table.add_row(
            f"{row['op']} {shapes}",
            row["kernel"],
            row["where"],
            f"{row['calls']:,}",
            f"{row['total_ms']:.2f}",
            f"{row['tflops']:.3g}" if row["flops"] else "-",
        )
    return table
