"""`hone bench --profile`: one step under torch.profiler, kernels by total time, and time grouped by where it was
launched (module in forward / recompute, autograd node in backward, optimizer). On a CPU each ATen op's own time
stands in for a kernel; the CUDA branch is checked on hand-built profiler events."""

from __future__ import annotations

import json
from types import SimpleNamespace

import torch
from peft import LoraConfig, get_peft_model
from torch.autograd import DeviceType

from hone.core.bench.diagnostics.profile import kernel_category, launch_group, module_label, profile_step, summarize
from hone.core.cli import main
from hone.core.data.collate import collate_packed
from hone.core.models.shapes import build_model
from hone.core.speed.checkpointing.checkpointer import apply_checkpointing, revert_checkpointing
from hone.core.train.loss import loss_sum
from tests.helpers.packed import random_rows

VOCAB = 256


class _TinyRunner:
    """What profile_step needs from a benchmark runner: `model` and `step()` (forward, loss, backward, AdamW)."""

    def __init__(self):
        model = build_model("tiny-dense", layers=2, seed=0, vocab_size=VOCAB)
        torch.manual_seed(0)
        self.model = get_peft_model(model, LoraConfig(r=4, target_modules=["q_proj", "down_proj"]))
        apply_checkpointing(self.model, "gpu", "cpu")  # decoder layers recomputed in backward
        params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(params, lr=1e-3)
        self.batch = collate_packed(random_rows([9, 14, 7], VOCAB, seed=1))
        self.steps = 0

    def step(self):
        self.model.train()
        loss_sum(self.model, self.batch).backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.steps += 1


def _profiled_tiny_step():
    """(runner, summary) of one step of `_TinyRunner` profiled on the CPU, checkpointing taken off afterwards."""
    runner = _TinyRunner()
    try:
        return runner, profile_step(runner, "cpu", top=500)
    finally:
        revert_checkpointing(runner.model)


def test_one_step_is_profiled_and_grouped_by_module_node_and_optimizer():
    runner, summary = _profiled_tiny_step()
    assert runner.steps == 1
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in runner.model.modules()), "hooks left behind"
    groups = {row["name"]: row for row in summary["groups"]}
    for expected in (
        "forward self_attn.q_proj.base_layer",
        "recompute self_attn.q_proj.base_layer",
        "forward mlp.down_proj.lora_A",
        "recompute mlp.down_proj.lora_B",
        "optimizer",
    ):
        assert expected in groups, f"{expected!r} missing from {sorted(groups)}"
        assert groups[expected]["calls"] >= 1 and groups[expected]["total_ms"] > 0, groups[expected]
    assert any(name.startswith("backward ") for name in groups), sorted(groups)
    # Two layers ran the q_proj base GEMM once in forward and once more when recomputed.
    assert (
        groups["forward self_attn.q_proj.base_layer"]["calls"]
        == groups["recompute self_attn.q_proj.base_layer"]["calls"]
    )
    kernels = summary["kernels"]
    assert [k["total_ms"] for k in kernels] == sorted((k["total_ms"] for k in kernels), reverse=True)
    assert "aten::mm" in {k["name"] for k in kernels} or "aten::addmm" in {k["name"] for k in kernels}
    total = sum(row["total_ms"] for row in summary["groups"])
    assert abs(total - summary["device_ms"]) <= 1e-6 * max(1.0, total) + 1e-3, (total, summary["device_ms"])
    assert abs(sum(summary["phases"].values()) - summary["device_ms"]) < 1e-3 * max(1.0, total)
    assert summary["wall_ms"] > 0 and summary["kernel_launches"] >= len(kernels)
    json.dumps(summary)


def _event(name, parent=None, kernels=(), device=DeviceType.CPU, us=0.0):
    return SimpleNamespace(
        name=name,
        cpu_parent=parent,
        kernels=list(kernels),
        device_type=device,
        time_range=SimpleNamespace(elapsed_us=lambda: us),
        cpu_children=[],
        self_cpu_time_total=0.0,
    )


def test_cuda_kernels_are_attributed_through_their_launching_op():
    kernel = SimpleNamespace  # torch's Kernel(name, device, duration)
    node = _event("autograd::engine::evaluate_function: _CheckpointedLayerBackward")
    recompute = _event("hone.module::mlp.gate_proj", parent=node)
    mm = _event("aten::mm", parent=recompute, kernels=[kernel(name="nvjet_gemm", device=0, duration=300.0)])
    lora = _event("autograd::engine::evaluate_function: LoRALinearFunctionBackward", parent=node)
    mm2 = _event("aten::mm", parent=lora, kernels=[kernel(name="nvjet_gemm", device=0, duration=500.0)])
    forward = _event("hone.module::self_attn")
    fa = _event(
        "aten::_flash_attention_forward",
        parent=forward,
        kernels=[kernel(name="flash_fwd_kernel", device=0, duration=200.0)],
    )
    device = [
        _event("nvjet_gemm", device=DeviceType.CUDA, us=300.0),
        _event("nvjet_gemm", device=DeviceType.CUDA, us=500.0),
        _event("flash_fwd_kernel", device=DeviceType.CUDA, us=200.0),
        _event("Memcpy HtoD (Pinned -> Device)", device=DeviceType.CUDA, us=100.0),
    ]  # a side-stream copy
    # a module range as the profiler also puts it on the GPU's timeline: it spans kernels, it is none
    spans = _event("hone.module::self_attn", device=DeviceType.CUDA, us=900.0)
    spans.is_user_annotation = True
    device.append(spans)
    summary = summarize([node, recompute, mm, lora, mm2, forward, fa, *device], cuda=True, wall_s=0.002)
    assert summary["device_ms"] == 1.1 and summary["attributed_ms"] == 1.0
    assert summary["kernels"][0] == {"name": "nvjet_gemm", "calls": 2, "total_ms": 0.8, "share": 0.8 / 1.1}
    groups = {row["name"]: row["total_ms"] for row in summary["groups"]}
    assert groups == {
        "backward LoRALinearFunctionBackward": 0.5,
        "recompute mlp.gate_proj": 0.3,
        "forward self_attn": 0.2,
    }
    assert summary["phases"] == {"backward": 0.5, "recompute": 0.3, "forward": 0.2}
    assert summary["categories"] == {"matmul": 0.8, "attention": 0.2, "copy": 0.1}


def test_labels_and_categories():
    assert module_label("base_model.model.model.layers.3.self_attn.q_proj.lora_A.default") == "self_attn.q_proj.lora_A"
    assert module_label("base_model.model.model.layers.11") == "decoder layer"
    assert module_label("base_model.model.lm_head") == "model.lm_head"
    assert module_label("") == "model"
    assert launch_group(_event("aten::add_", parent=_event("Optimizer.step#AdamW.step"))) == "optimizer"
    assert launch_group(_event("aten::norm", parent=_event("aten::_foreach_norm"))) == "other aten::_foreach_norm"
    for name, category in (
        ("sm90_xmma_gemm_bf16bf16_bf16f32", "matmul"),
        ("_rms_norm_forward_kernel", "triton"),
        ("triton_poi_fused_add_mul_0", "triton"),
        ("flash_fwd_kernel", "attention"),
        ("void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, cutlass::bfloat16_t>>", "attention"),
        ("cudnn_generated_fort_native_sdpa_sm90_flash_bprop_wgmma_f16_knob_26", "attention"),
        ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add>", "elementwise"),
        ("void at::native::reduce_kernel<512, 1>", "reduction"),
        ("Memcpy DtoH (Device -> Pinned)", "copy"),
        ("some_vendor_thing", "other"),
    ):
        assert kernel_category(name) == category, name


def test_bench_profile_option_prints_and_records_the_tables(tmp_path, capsys):
    out = tmp_path / "bench.json"
    code = main(
        [
            "bench",
            "tiny-dense",
            "--tokens",
            "48",
            "--steps",
            "1",
            "--warmup",
            "0",
            "--only",
            "hone-base",
            "--baseline",
            "hone-base",
            "--micro",
            "off",
            "--no-sync-count",
            "--profile",
            "--profile-top",
            "5",
            "--json",
            str(out),
        ]
    )
    assert code == 0
    printed = capsys.readouterr().out
    assert "profile of hone-base" in printed and "top kernels" in printed and "launched from" in printed
    assert "matmuls by operand shapes" in printed
    profile = json.loads(out.read_text())["runs"][0]["profile"]
    assert len(profile["kernels"]) == 5 and len(profile["groups"]) == 5, profile
    assert 1 <= len(profile["matmuls"]) <= 5, profile["matmuls"]


def test_matmuls_are_listed_by_shape_with_their_rate_and_where_they_ran():
    runner, summary = _profiled_tiny_step()
    rows = summary["matmuls"]
    assert rows, "no matmul rows"
    assert [r["total_ms"] for r in rows] == sorted((r["total_ms"] for r in rows), reverse=True)
    # 3 sequences of 9 + 14 + 7 = 30 tokens through q_proj's base weight (hidden x hidden): one shape, one row
    hidden = runner.model.config.hidden_size
    q_rows = [r for r in rows if r["shapes"] == [[30, hidden], [hidden, hidden]] and r["op"] == "aten::mm"]
    assert q_rows, [(r["op"], r["shapes"]) for r in rows]
    row = q_rows[0]
    assert row["calls"] >= 2 and row["flops"] == row["calls"] * 2 * 30 * hidden * hidden
    assert row["tflops"] > 0 and row["where"], row
    json.dumps(summary)


def test_matmul_flops_per_op():
    from hone.core.bench.diagnostics.profile import matmul_flops

    assert matmul_flops("aten::mm", [[8, 4], [4, 3]]) == 2 * 8 * 4 * 3
    assert matmul_flops("aten::addmm", [[3], [8, 4], [4, 3]]) == 2 * 8 * 4 * 3
    assert matmul_flops("aten::addmm_", [[8, 3], [8, 4], [4, 3]]) == 2 * 8 * 4 * 3
    assert matmul_flops("aten::bmm", [[2, 8, 4], [2, 4, 3]]) == 2 * 2 * 8 * 4 * 3
    assert matmul_flops("aten::baddbmm", [[2, 8, 3], [2, 8, 4], [2, 4, 3]]) == 2 * 2 * 8 * 4 * 3
    assert matmul_flops("aten::_grouped_mm", [[16, 4], [2, 4, 3], [2]]) == 0  # group sizes unknown: not counted
    assert matmul_flops("aten::mm", []) == 0


def test_cuda_matmul_kernels_are_listed_with_the_launching_ops_shapes():
    kernel = SimpleNamespace
    node = _event("autograd::engine::evaluate_function: LoRALinearFunctionBackward")
    mm = _event(
        "aten::mm",
        parent=node,
        kernels=[
            kernel(name="cutlass_80_tensorop_bf16_s16816gemm_bf16_128x64_64x3_nn_align2", device=0, duration=600.0)
        ],
    )
    mm.input_shapes = [[8175, 3420], [3420, 1280]]
    fa = _event("aten::_flash_attention_forward", kernels=[kernel(name="flash_fwd_kernel", device=0, duration=9.0)])
    fa.input_shapes = [[1, 2]]
    # a CUDA runtime event the profiler links a GEMM to: no shapes, no row
    stall = _event("Command Buffer Full", kernels=[kernel(name="nvjet_sm90_tst_128x256", device=0, duration=5.0)])
    summary = summarize([node, mm, fa, stall], cuda=True, wall_s=0.001)
    (row,) = summary["matmuls"]
    assert row["op"] == "aten::mm" and row["shapes"] == [[8175, 3420], [3420, 1280]] and row["calls"] == 1
    assert row["kernel"].endswith("nn_align2") and row["where"] == "backward LoRALinearFunctionBackward"
    assert abs(row["tflops"] - 2 * 8175 * 3420 * 1280 / 600e-6 / 1e12) < 1e-6
