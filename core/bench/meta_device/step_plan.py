"""A training step planned on the meta device: the anatomy (FLOPs, bytes, live memory) of Hone's MoE step.

`plan_moe_step("moe-qwen3", moe_backend="triton")` builds the benchmark's model at its real shape on the `meta`
device with the speed paths the `all` run takes on a GPU (packed varlen attention, Hone's experts backend with
split LoRA, recompute checkpointing, chunked loss, the run's optimizer), runs two steps the way `StepRunner.step`
does under `anatomy.StepAnatomy`, and keeps the second (the first creates the optimizer state).
`python -m hone.core.bench.meta_device.step_plan --backend triton` prints its tables by component and phase.
"""

from __future__ import annotations

import argparse
import contextlib
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_map

from hone.core.bench.meta_device.anatomy import (
    H200_BYTES_PER_S,
    H200_MATMUL_FLOPS,
    ModuleLabels,
    StepAnatomy,
    Summary,
    causal_attention_flops,
    summarize,
)

GIB = 2**30


@dataclass
class StepPlan:
    """What one planned step does and holds.

    Attributes:
        records: the second step's operations.
        resident_bytes: weights, LoRA parameters and optimizer state alive between steps.
        peak_bytes: highest live tensor memory during the second step (resident included).
        phase_peaks: highest live memory per phase (resident included).
        settings: how the step was set up (backend, optimizer, chunk, ...).
        peak_live: (bytes, description) of the tensors alive at the peak beyond the resident ones.
    """

    records: list
    resident_bytes: int
    peak_bytes: int
    phase_peaks: dict[str, int]
    settings: dict
    peak_live: list = field(default_factory=list)

    def components(self) -> dict[str, Summary]:
        return summarize(self.records, lambda r: r.component)

    def phases(self) -> dict[str, Summary]:
        return summarize(self.records, lambda r: r.phase)

    def predicted_seconds(self) -> float:
        return sum(r.seconds() for r in self.records)


class MetaAutocast(TorchFunctionMode):
    """What CUDA autocast does to the step's matmuls, for meta tensors (which have no autocast): the operands of
    linear / matmul family calls are cast to `dtype`, so fp32 LoRA weights meet bf16 activations in bf16 and
    give bf16 outputs, as on the GPU."""

    _CASTS = frozenset(
        {
            F.linear,
            torch.matmul,
            torch.mm,
            torch.addmm,
            torch.bmm,
            torch.baddbmm,
            torch.Tensor.matmul,
            torch.Tensor.__matmul__,
            torch.Tensor.mm,
            torch.Tensor.bmm,
        }
    )

    def __init__(self, dtype: torch.dtype = torch.bfloat16):
        super().__init__()
        self.dtype = dtype

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in self._CASTS:

            def cast(t):
                return t.to(self.dtype) if isinstance(t, torch.Tensor) and t.dtype == torch.float32 else t

            args = tree_map(cast, args)
            kwargs = tree_map(cast, kwargs)
        return func(*args, **kwargs)


def _parameter_bytes(model, optimizer) -> int:
    seen: dict[int, int] = {}
    tensors = list(model.parameters()) + list(model.buffers())
    for state in getattr(optimizer, "state", {}).values():
        tensors += [t for t in state.values() if torch.is_tensor(t)]
    tensors += [t for t in vars(optimizer).values() if torch.is_tensor(t)]  # flat buffers (FlatAdamW)
    for t in tensors:
        storage = t.untyped_storage()
        seen[id(storage)] = storage.nbytes()
    return sum(seen.values())


def plan_moe_step(
    scenario: str = "moe-qwen3",
    *,
    moe_backend: str = "triton",
    layers: int | None = None,
    tokens: int | None = None,
    lora_r: int = 16,
    optimizer: str = "adamw",
    loss_chunk: int | None = None,
    checkpoint: str = "gpu",
    kernels: str = "all",
    fused_loss: bool = True,
    fused_gate: bool = True,
    tile_mlp: bool = False,
    group_tokens: int = 0,
    seed: int = 0,
) -> StepPlan:
    """Plan one steady-state step of the benchmark's Hone `all` run (see the module docstring).

    Args:
        scenario: a `hone bench` scenario with experts (moe-qwen3, moe-gptoss, tiny-moe-*).
        moe_backend: grouped_mm | triton (both take their GPU code path on meta tensors).
        optimizer: TrainConfig.optimizer.
        loss_chunk: tokens per loss chunk (None: the loss's own choice).
        checkpoint: gpu (recompute) | off.
        kernels: "all" (Hone's fused kernels as `speed.kernels` applies them on a GPU), "no-lora" (all but the
            fused LoRA linear), "none".
        fused_loss, fused_gate: the fused cross-entropy kernel and the experts' fused silu gate (both follow
            `speed.kernels` in a run; separate here to price each).
        tile_mlp, group_tokens: `speed.tiled_mlp` and `speed.layer_group_tokens` (off by default here).
    """
    from hone.core.bench.batch import make_batch
    from hone.core.bench.scenarios import get_scenario
    from hone.core.bench.weights import architecture_facts, bench_model_info, build_bench_model, vocab_size
    from hone.core.config import LoraConfig, TrainConfig
    from hone.core.data.collate import collate_packed
    from hone.core.speed import attention, moe
    from hone.core.speed.checkpointing import checkpointer
    from hone.core.train.lora import apply_lora
    from hone.core.train.loss import loss_sum
    from hone.core.train.optim import build_optimizer

    device = "meta"
    spec = get_scenario(scenario)
    facts = architecture_facts(spec, layers)
    batch = make_batch(tokens or spec.tokens, vocab_size(spec), seed=seed, min_len=spec.min_len, max_len=spec.max_len)
    model = build_bench_model(spec, layers, seed=seed, dtype=torch.bfloat16, device=device)
    attention.apply_attention(model, attention.IMPLEMENTATIONS["varlen"])
    moe.apply_backend(model, moe_backend)
    moe.set_fused_gate(model, fused_gate)
    torch.manual_seed(seed)
    model, _ = apply_lora(model, LoraConfig(r=lora_r, alpha=2.0 * lora_r), bench_model_info(model, spec))
    if checkpoint != "off":
        checkpointer.apply_checkpointing(model, checkpoint, device, group_tokens=group_tokens)
    if kernels != "none":
        _apply_kernels_on_meta(model, lora=kernels == "all", tile_mlp=tile_mlp)
    params = [p for p in model.parameters() if p.requires_grad]
    train = TrainConfig(optimizer=optimizer, max_grad_norm=1.0)
    opt = build_optimizer(params, train, device)
    rows = batch.tokenized_set()
    packed = collate_packed([rows[i] for i in batch.packs()[0]]).to(device)
    forward, backward = causal_attention_flops(list(batch.lengths), facts["heads"], facts["head_dim"])

    def attention_flops(op: str) -> float:
        return backward if "backward" in op else forward

    labels = ModuleLabels(model)
    anatomy = StepAnatomy(labels, attention_flops, lora_width=2 * lora_r)  # peft doubles gate_up's rank
    model.train()
    autocast = MetaAutocast()
    with (
        labels,
        autocast,
        _recompute_under(autocast),
        anatomy,
        _account_triton(anatomy),
        _observe_kernels(anatomy),
        _chunk(loss_chunk),
    ):
        for step in range(2):
            if step == 1:
                anatomy.records.clear()
                anatomy.reset_peak()
                resident = _parameter_bytes(model, opt)
                start_live = anatomy.live_bytes
            _one_step(model, packed, params, opt, anatomy, loss_sum, fused_loss)
    offset = resident - start_live  # the resident memory the anatomy did not see allocated
    return StepPlan(
        records=list(anatomy.records),
        resident_bytes=resident,
        peak_bytes=anatomy.peak_bytes + offset,
        phase_peaks={k: v + offset for k, v in anatomy.phase_peaks.items()},
        settings={
            "scenario": scenario,
            "moe_backend": moe_backend,
            "optimizer": optimizer,
            "loss_chunk": loss_chunk,
            "checkpoint": checkpoint,
            "kernels": kernels,
            "fused_loss": fused_loss,
            "fused_gate": fused_gate,
            "tile_mlp": tile_mlp,
            "group_tokens": group_tokens,
            "tokens": batch.tokens,
            "trainable_params": sum(p.numel() for p in params),
        },
        peak_live=sorted(anatomy.peak_live, reverse=True),
    )


# Kernels that touch their tensors more than once: the cross-entropy kernel reads the logits twice and writes them;
# the AdamW kernel reads and writes parameters and moments (18 bytes per value against 10 counted once).
_PASSES = {"_cross_entropy_kernel": 3, "_adamw_kernel": 1.8}


def _apply_kernels_on_meta(model, *, lora: bool, tile_mlp: bool = False) -> None:
    """`hone.core.speed.fused.apply.apply_kernels` on a meta model. Its probes compare outputs, which meta tensors
    cannot: the norms get the style the H200 run's probe chose for these families ("llama": weight x normalized
    input)."""
    from hone.core.speed.fused import apply as fused_apply

    probe, patch_lora = fused_apply._probe_norm_style, fused_apply._patch_lora
    fused_apply._probe_norm_style = lambda module, weight, eps: "llama"
    if not lora:
        fused_apply._patch_lora = lambda *args: None
    try:
        fused_apply.apply_kernels(model, tile_mlp=tile_mlp)
    finally:
        fused_apply._probe_norm_style, fused_apply._patch_lora = probe, patch_lora


@contextlib.contextmanager
def _recompute_under(mode: TorchFunctionMode):
    """Enter `mode` for checkpoint recomputes too: they run in backward, on the autograd engine's thread, which does
    not inherit the caller's torch-function modes (CUDA autocast state is replayed by the checkpoint instead)."""
    from hone.core.speed.checkpointing import layer_recompute

    replayed = layer_recompute._replayed

    @contextlib.contextmanager
    def replayed_under_mode(state):
        with replayed(state), mode:
            yield

    layer_recompute._replayed = replayed_under_mode
    try:
        yield
    finally:
        layer_recompute._replayed = replayed


@contextlib.contextmanager
def _observe_kernels(anatomy: StepAnatomy):
    """Count the bytes of the fused kernels' launches on meta tensors: every tensor argument read or written once."""
    from hone.kernels import _runtime

    def observe(name: str, args) -> None:
        seen, moved = set(), 0
        for t in args:
            if isinstance(t, torch.Tensor) and id(t) not in seen:
                seen.add(id(t))
                moved += t.numel() * t.element_size()
        anatomy.add(name.lstrip("_"), 0.0, moved * _PASSES.get(name, 1))

    previous, _runtime.META_KERNEL_OBSERVER = _runtime.META_KERNEL_OBSERVER, observe
    try:
        yield
    finally:
        _runtime.META_KERNEL_OBSERVER = previous


@contextlib.contextmanager
def _account_triton(anatomy: StepAnatomy):
    """Record the cost of Hone's Triton grouped GEMMs, which launch no aten operation the anatomy could see.

    Bytes: the (gathered) input rows, each expert's weight once (its row tiles share it through L2), the output
    and the LoRA operands; weight gradients: both row operands and the fp32 result.
    """
    from hone.kernels.moe.grouped_gemm import launch

    forward, wgrad = launch.grouped_gemm_forward, launch.grouped_gemm_wgrad

    def counted_forward(x, w, group_ends, **kwargs):
        out = forward(x, w, group_ends, **kwargs)
        rows, n = out.shape
        k, size = w.shape[1], x.element_size()
        flops, moved = 2.0 * rows * k * n, size * (rows * k + w[:, :, :].numel() + rows * n)
        lora_x, lora_w = kwargs.get("lora_x"), kwargs.get("lora_w")
        if lora_x is not None:
            flops += 2.0 * rows * lora_x.shape[1] * n
            moved += size * (lora_x.numel() + lora_w.numel())
        narrow = min(k, n) <= anatomy.lora_width
        anatomy.add(
            "triton_grouped_gemm",
            flops,
            moved,
            grouped=True,
            component="experts LoRA GEMMs" if narrow else "experts GEMMs",
        )
        return out

    def counted_wgrad(p, q, group_ends, **kwargs):
        out = wgrad(p, q, group_ends, **kwargs)
        rows = p.shape[0] if kwargs.get("gather_p") is None else kwargs["gather_p"].shape[0]
        m, n = p.shape[1], q.shape[1]
        anatomy.add(
            "triton_grouped_gemm_wgrad",
            2.0 * rows * m * n,
            p.element_size() * rows * (m + n) + out.numel() * out.element_size(),
            grouped=True,
            component="experts LoRA GEMMs" if min(m, n) <= anatomy.lora_width else "experts GEMMs",
        )
        return out

    launch.grouped_gemm_forward, launch.grouped_gemm_wgrad = counted_forward, counted_wgrad
    try:
        yield
    finally:
        launch.grouped_gemm_forward, launch.grouped_gemm_wgrad = forward, wgrad


@contextlib.contextmanager
def _chunk(tokens: int | None):
    """Fix the loss's chunk size for the plan (None keeps its own choice)."""
    from hone.core.train import loss

    if tokens is None:
        yield
        return
    original = loss.auto_chunk_tokens
    loss.auto_chunk_tokens = lambda vocab, fused=False: tokens
    try:
        yield
    finally:
        loss.auto_chunk_tokens = original


def _one_step(model, batch, params, optimizer, anatomy: StepAnatomy, loss_sum, fused_loss: bool) -> None:
    """What `StepRunner.step` does for one micro-batch, minus the host reads (meta tensors hold no values)."""
    from hone.core.train import loss as loss_module

    original = loss_module.chunked_head_loss

    def labelled_head_loss(*args, **kwargs):
        with anatomy.labelled("loss"):
            return original(*args, **kwargs)

    loss_module.chunked_head_loss = labelled_head_loss
    try:
        summed = loss_sum(model, batch, mode="chunked", fused=fused_loss)
    finally:
        loss_module.chunked_head_loss = original
    (summed / max(batch.num_trained, 1)).backward()
    with anatomy.labelled("clip"):
        clip = getattr(optimizer, "clip_grad_norm_", None)
        if clip is not None:
            clip(1.0)
        else:
            torch.nn.utils.clip_grad_norm_(params, 1.0)
    with anatomy.labelled("optimizer"):
        optimizer.step()
    with anatomy.labelled("zero_grad"):
        optimizer.zero_grad(set_to_none=True)


def print_plan(plan: StepPlan, matmul_flops: float = H200_MATMUL_FLOPS, bytes_per_s: float = H200_BYTES_PER_S) -> None:
    """Print the component table, the phase table and the memory peaks."""
    total = plan.predicted_seconds()
    print(f"settings: {plan.settings}")
    print(
        f"predicted step (roofline, H200): {total * 1e3:.1f} ms; resident {plan.resident_bytes / GIB:.2f} GiB, "
        f"peak {plan.peak_bytes / GIB:.2f} GiB"
    )
    for title, table in (("component", plan.components()), ("phase", plan.phases())):
        print(f"{title:<40} {'ms':>7} {'TFLOP':>7} {'GB':>7} {'kernels':>8}")
        for name, s in table.items():
            print(f"{name:<40} {s.seconds * 1e3:7.2f} {s.flops / 1e12:7.2f} {s.bytes / 1e9:7.2f} {s.kernels:8d}")
    print("peak live memory by phase (GiB): " + ", ".join(f"{k} {v / GIB:.2f}" for k, v in plan.phase_peaks.items()))


def main(argv: list[str] | None = None) -> int:
    """`python -m hone.core.bench.meta_device.step_plan [--scenario moe-qwen3] [--backend triton]`: print the
    plan's tables."""
    parser = argparse.ArgumentParser(
        prog="python -m hone.core.bench.meta_device.step_plan", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--scenario", default="moe-qwen3", help="a `hone bench` scenario (default moe-qwen3)")
    parser.add_argument(
        "--backend", default="triton", choices=["grouped_mm", "triton"], help="Hone's experts backend (default triton)"
    )
    args = parser.parse_args(argv)
    print_plan(plan_moe_step(args.scenario, moe_backend=args.backend))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
