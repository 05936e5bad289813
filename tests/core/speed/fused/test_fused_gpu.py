"""Kernels on vs off on a CUDA GPU, where the compiled Triton kernels run (`pytest -m gpu`).

Tiny and real-width Qwen3 / Llama models with peft LoRA train a few steps on packed rows with and without
`apply_kernels`; losses must agree within the dtype's tolerance, checkpoint recompute must be exact, QLoRA
(bitsandbytes nf4, when installed) and regional compilation must give the same losses.
"""

from __future__ import annotations

import pytest
import torch
from peft import LoraConfig, get_peft_model

from hone.core.models.shapes import build_model
from hone.core.speed.compile import compile_blocks, uncompile_blocks
from hone.core.speed.fused.apply import apply_kernels, revert_kernels

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
# Loss tolerance after a few steps: fp32 differs by summation order only; bf16 and fp16 by one rounding per op.
LOSS_TOL = {torch.float32: 1e-4, torch.bfloat16: 3e-2, torch.float16: 1e-2}


def _model(shape, dtype, *, layers=2, vocab=4096, seed=0, checkpointing=False):
    model = build_model(shape, layers=layers, seed=seed, dtype=dtype, device="cuda", vocab_size=vocab)
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    torch.manual_seed(seed)
    model = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, target_modules=TARGETS))
    g = torch.Generator(device="cuda").manual_seed(seed)
    for name, param in model.named_parameters():
        if "lora_B" in name:
            with torch.no_grad():
                param.normal_(0.0, 0.02, generator=g)
    return model


def _batch(tokens: int, vocab: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (1, tokens), generator=g)
    lengths, left = [], tokens
    while left:
        lengths.append(min(left, int(torch.randint(tokens // 8 + 1, tokens // 2 + 2, (1,), generator=g))))
        left -= lengths[-1]
    pos = torch.cat([torch.arange(n) for n in lengths])[None]
    return ids.cuda(), pos.cuda()


def _train(model, ids, pos, steps: int) -> list[float]:
    model.train()
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    losses = []
    for _ in range(steps):
        loss = model(input_ids=ids, position_ids=pos, labels=ids, use_cache=False).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses


def _assert_losses_match(fused, plain, dtype, what):
    diffs = [abs(a - b) for a, b in zip(fused, plain, strict=True)]
    assert max(diffs) <= LOSS_TOL[dtype] * max(1.0, abs(plain[0])), (
        f"{what}: kernels {fused} vs plain {plain} (max diff {max(diffs):.2e})"
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", ["tiny-dense", "tiny-llama"])
def test_tiny_models_train_the_same_with_kernels(shape, dtype):
    ids, pos = _batch(256, 4096)
    plain = _train(_model(shape, dtype), ids, pos, steps=5)
    model = _model(shape, dtype)
    report = apply_kernels(model)
    assert report.backend == "triton" and report.count("rope") == 2 and report.count("lora_linear") == 14, (
        report.summary()
    )
    norm = model.get_base_model().model.norm
    probe = torch.randn(3, norm.weight.shape[0], device="cuda", dtype=dtype, requires_grad=True)
    assert type(norm(probe).grad_fn).__name__ == "RMSNormFunctionBackward", "the Triton path is not running"
    fused = _train(model, ids, pos, steps=5)
    _assert_losses_match(fused, plain, dtype, f"{shape} {dtype}")
    assert revert_kernels(model) == sum(report.patched.values())


def test_real_width_qwen3_trains_the_same_and_uses_less_memory():
    """Qwen3-0.6B widths (hidden 1024, 16 x 128 heads, MLP 3072), 2 layers, 4096 packed tokens, bf16."""
    ids, pos = _batch(4096, 151936, seed=1)
    results = {}
    for fused in (False, True):
        torch.cuda.empty_cache()
        model = _model("dense-0.6b", torch.bfloat16, vocab=151936)
        if fused:
            apply_kernels(model)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        losses = _train(model, ids, pos, steps=3)
        peak = (torch.cuda.max_memory_allocated() - base) / 2**20
        results[fused] = (losses, peak)
        del model
    (plain, plain_peak), (fused, fused_peak) = results[False], results[True]
    _assert_losses_match(fused, plain, torch.bfloat16, "dense-0.6b x2 layers")
    assert fused_peak <= plain_peak * 1.02, f"peak MiB with kernels {fused_peak:.0f} vs without {plain_peak:.0f}"


def test_gradient_checkpointing_recompute_is_exact():
    ids, pos = _batch(512, 4096, seed=2)
    grads = []
    for checkpointing in (False, True):
        model = _model("tiny-dense", torch.float32, checkpointing=checkpointing)
        apply_kernels(model)
        model.train()
        model(input_ids=ids, position_ids=pos, labels=ids, use_cache=False).loss.backward()
        grads.append({n: p.grad for n, p in model.named_parameters() if p.grad is not None})
    assert grads[0].keys() == grads[1].keys()
    for name, grad in grads[0].items():
        torch.testing.assert_close(grads[1][name], grad, atol=1e-6, rtol=1e-5, msg=lambda m, n=name: f"{n}: {m}")


def test_qlora_model_trains_the_same_with_kernels(tmp_path):
    pytest.importorskip("bitsandbytes")
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    build_model("tiny-dense", layers=2, vocab_size=4096).save_pretrained(tmp_path)
    quantization = BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type="nf4",
        bnb_4bit_use_double_quant=True,
        bnb_4bit_compute_dtype=torch.bfloat16,
    )
    ids, pos = _batch(256, 4096, seed=3)
    losses = {}
    for fused in (False, True):
        model = AutoModelForCausalLM.from_pretrained(
            tmp_path, quantization_config=quantization, dtype=torch.bfloat16, device_map={"": 0}
        )
        torch.manual_seed(0)
        model = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, target_modules=TARGETS))
        if fused:
            report = apply_kernels(model)
            assert report.count("qlora_linear") == 14, report.summary()
        losses[fused] = _train(model, ids, pos, steps=3)
    _assert_losses_match(losses[True], losses[False], torch.bfloat16, "QLoRA tiny-dense")


def test_compiled_blocks_with_kernels_train_the_same():
    """Inductor on one block (its compile time dominates this test), kernels stepping aside inside it."""
    ids, pos = _batch(256, 4096, seed=4)
    plain = _train(_model("tiny-dense", torch.bfloat16, layers=1), ids, pos, steps=2)
    model = _model("tiny-dense", torch.bfloat16, layers=1)
    apply_kernels(model)
    report = compile_blocks(model)
    compiled = _train(model, ids, pos, steps=2)
    assert report.blocks == 1 and report.compile_seconds and report.compile_seconds > 0, report.to_dict()
    _assert_losses_match(compiled, plain, torch.bfloat16, "compiled tiny-dense")
    assert uncompile_blocks(model) == 1
