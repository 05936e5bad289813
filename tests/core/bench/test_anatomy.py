"""Step anatomy on the meta device: live memory, FLOPs and bytes of known operations, module labels in forward and
backward, and a whole planned MoE step whose expert GEMM FLOPs match a hand count."""

from __future__ import annotations

import torch

from hone.core.bench.meta_device.anatomy import ModuleLabels, StepAnatomy, causal_attention_flops
from hone.core.bench.meta_device.step_plan import plan_moe_step


def test_live_memory_peak_and_op_costs_are_exact():
    with StepAnatomy() as anatomy:
        a = torch.empty(1000, device="meta")  # 4,000 bytes
        b = torch.empty(500, 8, device="meta")  # 16,000 bytes
        c = a.view(10, 100)  # a view: no memory, no record; it keeps a's storage alive
        del a
        d = torch.mm(b.view(100, 40), torch.empty(40, 30, device="meta"))  # 2 x 100 x 40 x 30 FLOPs
        e = d + 1.0  # the (40, 30) operand is gone by now; a, b, d and e are alive: the peak
        del b, c
    assert anatomy.peak_bytes == 4000 + 16000 + 2 * 100 * 30 * 4
    assert anatomy.live_bytes == 2 * 100 * 30 * 4, "d and e are still alive, everything else was freed"
    mm = next(r for r in anatomy.records if r.op == "mm")
    assert mm.flops == 2 * 100 * 40 * 30
    assert mm.bytes == 4 * (100 * 40 + 40 * 30 + 100 * 30)
    add = next(r for r in anatomy.records if r.op == "add")
    assert add.flops == 0 and add.bytes == 4 * 2 * 100 * 30
    assert not any(r.op == "view" for r in anatomy.records)
    del d, e


def test_module_labels_follow_forward_and_backward():
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4)).to("meta")
    labels = ModuleLabels(model)
    with labels, StepAnatomy(labels) as anatomy:
        model(torch.empty(5, 8, device="meta", requires_grad=True)).sum().backward()
    assert labels.stack == [], "every module's forward was closed"
    assert {(r.phase, r.op, r.module) for r in anatomy.records if r.flops} >= {
        ("forward", "addmm", "0"),
        ("forward", "addmm", "2"),
        ("backward", "mm", "2"),
        ("backward", "mm", "0"),
    }


def test_planned_moe_step_counts_the_expert_gemms():
    """tiny-moe-qwen3: 2 layers, 512 tokens, top-2 of 8 experts, hidden 64, expert width 32. Each pass through an
    experts layer multiplies S = 1,024 rows by gate_up (64 -> 64) and down (32 -> 64): 2 S (64 x 64 + 32 x 64) FLOPs,
    three times per step (forward, checkpoint recompute, input-gradient backward; the base weights are frozen).
    LoRA rank 4 (8 on gate_up) keeps the factor products apart from the expert widths."""
    plan = plan_moe_step("tiny-moe-qwen3", moe_backend="grouped_mm", kernels="none", lora_r=4)
    rows = 512 * 2
    expected = 2 * 3 * 2 * rows * (64 * 64 + 32 * 64)
    got = plan.components()["experts GEMMs"].flops
    assert got == expected, f"expert GEMM FLOPs {got:.4g} vs hand count {expected:.4g}"
    assert plan.peak_bytes > plan.resident_bytes > 0
    assert max(plan.phase_peaks, key=plan.phase_peaks.get) in ("backward", "recompute", "loss", "forward")
    assert {"forward", "recompute", "backward", "loss", "optimizer"} <= set(plan.phases())
    assert plan.predicted_seconds() > 0


def test_attention_flops_of_packed_causal_sequences():
    forward, backward = causal_attention_flops([2, 3], heads=4, head_dim=8)
    pairs = 3 + 6  # lower triangles of 2 and 3 tokens, diagonal included
    assert forward == 4 * pairs * 4 * 8 and backward == 2.5 * forward
