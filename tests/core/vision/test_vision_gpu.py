"""GPU: `hone bench vision-qwen2.5-vl` at 4 text layers (the scenario builds all 36): a Qwen2.5-VL-3B-shaped model
(random init) trains on mixed rows through Hone and through plain transformers + peft, and both report speed and
memory."""

from __future__ import annotations

import json
import os

import pytest

pytestmark = pytest.mark.gpu


def test_vision_bench_runs_both_paths(tmp_path):
    import torch

    from hone.core.cli import main

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    out = tmp_path / "bench.json"
    tokenizer = ["--tokenizer", os.environ["HONE_TEST_TOKENIZER"]] if os.environ.get("HONE_TEST_TOKENIZER") else []
    # 5 optimizer steps per path, the first 2 untimed
    assert (
        main(
            [
                "bench",
                "vision-qwen2.5-vl",
                "--layers",
                "4",
                "--warmup",
                "2",
                "--steps",
                "3",
                "--tokens",
                "4096",
                "--json",
                str(out),
                *tokenizer,
            ]
        )
        == 0
    )
    data = json.loads(out.read_text())
    runs = {r["name"]: r for r in data["runs"]}
    hone, ref = runs["hone"], runs["reference"]
    for name, r in (("hone", hone), ("reference", ref)):
        assert r["status"] == "ok", f"{name}: {r['reason']}\n{r['details']}"
        assert r["tokens_per_s"] > 0 and r["peak_allocated_gib"] > 0, (name, r)
        losses = data["losses"][name]
        assert all(loss == loss for loss in losses), f"{name} losses not finite: {losses}"
    # the same data and model: the first losses agree to within the different batchings (packed vs padded)
    assert abs(hone["first_loss"] - ref["first_loss"]) / ref["first_loss"] < 0.15, data["losses"]
    assert hone["peak_allocated_gib"] <= ref["peak_allocated_gib"] * 1.2, (
        f"Hone peak {hone['peak_allocated_gib']:.1f} GiB vs {ref['peak_allocated_gib']:.1f}"
    )


def _packed_on_gpu(kind, vision_kit, mixed_rows):
    """(bf16 model on the GPU with varlen on its language model, its packing collator, the tokenized mixed rows);
    skips without a GPU or the family's classes."""
    import copy

    import torch
    from test_vision_batches import collator, encode

    from hone.core.config import SpeedConfig
    from hone.core.speed import attention
    from hone.core.vision import tiny

    if tiny.available(kind):
        pytest.skip(tiny.available(kind))
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    processor, cpu_model = vision_kit(kind)
    model = copy.deepcopy(cpu_model).to("cuda", torch.bfloat16)
    folder, rows = mixed_rows
    choice = attention.configure(model, SpeedConfig(attention="auto"), "cuda")
    assert choice.name == "varlen", choice.reason
    make = collator(processor, model, packing=True)
    make.dtype = torch.bfloat16
    return model, make, encode(processor, folder, rows)


@pytest.mark.parametrize("kind", ["qwen2_5_vl", "qwen3_vl", "llava", "idefics3"])  # every packed family
def test_varlen_on_the_language_model_equals_rows_one_by_one(kind, vision_kit, mixed_rows):
    """On the GPU in bf16 the language model takes torch's varlen attention; packed mixed rows give each row's
    loss and gradients run alone, to bf16 rounding."""
    import torch
    from test_vision_batches import _grads

    from hone.core.train.loss import loss_sum

    model, make, tokenized = _packed_on_gpu(kind, vision_kit, mixed_rows)
    batch = make.collate(tokenized).to("cuda")
    together = loss_sum(model, batch, mode="plain")
    together.backward()
    grads_together = _grads(model)
    model.zero_grad()
    alone = sum(loss_sum(model, make.collate([row]).to("cuda"), mode="plain") for row in tokenized)
    alone.backward()
    grads_alone = _grads(model)
    assert torch.allclose(together.float(), alone.float(), rtol=2e-2), (float(together), float(alone))
    worst = max(
        ((grads_together[n].float() - grads_alone[n].float()).norm() / (grads_alone[n].float().norm() + 1e-6)).item()
        for n in grads_alone
    )
    assert worst < 5e-2, f"{kind}: gradients differ by {worst:.2e} (relative norm)"


@pytest.mark.parametrize("kind", ["qwen2_5_vl", "qwen3_vl"])
def test_triton_kernels_on_qwen_vl_train_like_the_plain_model(kind, vision_kit, mixed_rows):
    """The fused Triton norms, gated MLPs, rope and decoder adds on Qwen-VL in bf16: the loss and gradients of
    the unfused model, to bf16 rounding."""
    import copy

    import torch
    from test_vision_batches import _grads, collator, encode

    from hone.core.speed.fused.apply import apply_kernels
    from hone.core.train.loss import loss_sum

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    processor, cpu_model = vision_kit(kind)
    plain = copy.deepcopy(cpu_model).to("cuda", torch.bfloat16)
    fused = copy.deepcopy(plain)
    report = apply_kernels(fused)
    assert report.backend == "triton" and report.patched.get("add_rms_norm"), report.summary()
    folder, rows = mixed_rows
    make = collator(processor, plain, packing=True)
    make.dtype = torch.bfloat16
    batch = make.collate(encode(processor, folder, rows)).to("cuda")
    results = []
    for model in (plain, fused):
        loss = loss_sum(model, batch, mode="plain")
        loss.backward()
        results.append((loss.detach().float(), _grads(model)))
    (loss_plain, grads_plain), (loss_fused, grads_fused) = results
    assert torch.allclose(loss_fused, loss_plain, rtol=1e-2), (float(loss_fused), float(loss_plain))
    worst = max(
        ((grads_fused[n].float() - g.float()).norm() / (g.float().norm() + 1e-6)).item() for n, g in grads_plain.items()
    )
    assert worst < 5e-2, f"{kind}: gradients differ by {worst:.2e} (relative norm): {report.summary()}"


@pytest.mark.parametrize("kind", ["qwen2_5_vl", "qwen3_vl", "llava", "idefics3"])  # every packed family
def test_packed_vision_step_makes_no_host_sync(kind, vision_kit, mixed_rows):
    """A packed mixed batch's forward + backward (varlen on the language model and the Qwen-VL encoders, images
    merged at positions found on the host) with the batch already on the GPU: no host sync. Counted under CUDA's
    sync debug mode; the first calls that sync are named in the failure. The image grid stays on the host."""
    import warnings

    import torch

    from hone.core.train.loss import loss_sum

    model, make, tokenized = _packed_on_gpu(kind, vision_kit, mixed_rows)
    batch = make.collate(tokenized, pin_memory=True).to("cuda")
    assert batch.image_positions is not None and batch.image_positions.is_cuda
    assert all(v.device.type == "cpu" if k == "image_grid_thw" else v.is_cuda for k, v in batch.pixels.items())
    loss_sum(model, batch, mode="plain").backward()  # warm-up: lazy initialisation may sync once
    model.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            loss_sum(model, batch, mode="plain").backward()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    syncs = [w for w in caught if "synchronizing CUDA operation" in str(w.message)]
    where = [f"{w.filename}:{w.lineno}" for w in syncs[:5]]
    assert not syncs, f"{kind}: {len(syncs)} host syncs in forward + backward, first at {where}"
