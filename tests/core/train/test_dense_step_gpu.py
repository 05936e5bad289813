"""The dense step's GPU-only facts (`pytest -m gpu`): the fused LoRA linear runs under CUDA autocast (how the
trainer runs bf16 models), and the chunked loss over a 151,936-token vocabulary stays within its memory budget."""

from __future__ import annotations

import pytest
import torch
from peft import LoraConfig, get_peft_model

from hone.core.models.shapes import build_model
from hone.core.speed.fused import lora_layers
from hone.core.speed.fused.apply import apply_kernels
from hone.core.train.loss import chunked_head_loss

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
GIB = 2**30


def _model():
    model = build_model("tiny-dense", layers=2, seed=0, dtype=torch.bfloat16, device="cuda", vocab_size=1024)
    torch.manual_seed(0)
    model = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, target_modules=TARGETS))
    for name, param in model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(param, std=0.02)
    return model


def _loss(model):
    ids = torch.randint(0, 1024, (1, 256), device="cuda", generator=torch.Generator("cuda").manual_seed(1))
    pos = torch.cat([torch.arange(100), torch.arange(156)]).to("cuda")[None]
    with torch.autocast("cuda", dtype=torch.bfloat16):
        logits = model(input_ids=ids, position_ids=pos, use_cache=False).logits
    loss = torch.nn.functional.cross_entropy(logits[0, :-1].float(), ids[0, 1:])
    loss.backward()
    return loss.item()


def test_fused_lora_linear_runs_under_cuda_autocast(monkeypatch):
    want = _loss(_model())
    model = _model()
    apply_kernels(model)
    calls = []
    original = lora_layers.lora_linear
    monkeypatch.setattr(lora_layers, "lora_linear", lambda *a, **k: calls.append(1) or original(*a, **k))
    got = _loss(model)
    assert len(calls) == 14, (
        f"the fused LoRA linear ran {len(calls)} times under CUDA autocast, expected 14 "
        "(2 layers x 7 linears): peft's eager path is running instead"
    )
    assert abs(got - want) < 3e-2 * abs(want), f"loss {got} with the fused LoRA vs {want} with peft's"


def test_chunked_loss_transient_memory_over_a_qwen3_vocabulary():
    """4,096 tokens through a frozen 151,936 x 1,024 head: chunks of 2**26 fp32 logits need ~0.4 GiB at once
    (fp32 logits, their bf16 source or bf16 gradient); the 2**28 chunks with logsumexp's temporary needed ~2.5."""
    g = torch.Generator("cuda").manual_seed(0)
    head = torch.nn.Linear(1024, 151936, bias=False, device="cuda", dtype=torch.bfloat16).requires_grad_(False)
    hidden = torch.randn(4096, 1024, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_(True)
    targets = torch.randint(0, 151936, (4096,), device="cuda", generator=g)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    loss = chunked_head_loss(hidden, targets, head)
    loss.backward()
    torch.cuda.synchronize()
    transient = (torch.cuda.max_memory_allocated() - before) / GIB
    reference = torch.nn.functional.cross_entropy(head(hidden.detach()).float(), targets, reduction="sum")
    assert abs(loss.item() - reference.item()) < 1e-3 * abs(reference.item()), (loss.item(), reference.item())
    assert transient < 0.6, f"the chunked loss took {transient:.2f} GiB above its inputs (budget 0.6 GiB)"


def _one_layer_8b_step(tile_mlp: bool):
    """One decoder layer at Qwen3-8B width (small vocabulary), 8,192 packed tokens, recompute checkpointing, fused
    kernels, bf16 autocast: (peak GiB above the model, loss, LoRA gradient norm)."""
    from hone.core.config import SpeedConfig
    from hone.core.data.collate import collate_packed
    from hone.core.speed import attention
    from hone.core.speed.checkpointing.checkpointer import apply_checkpointing
    from hone.core.train.loss import loss_sum
    from tests.helpers.packed import random_rows

    model = build_model("dense-8b", layers=1, seed=0, dtype=torch.bfloat16, device="cuda", vocab_size=4096)
    attention.configure(model, SpeedConfig(attention="auto"), "cuda")
    torch.manual_seed(0)
    model = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, target_modules=TARGETS))
    for name, param in model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(param, std=0.02, generator=torch.Generator("cuda").manual_seed(len(name)))
    apply_checkpointing(model, "gpu", "cuda")
    assert apply_kernels(model, tile_mlp=tile_mlp).count("tiled_mlp") == (1 if tile_mlp else 0)
    batch = collate_packed(random_rows([2048, 1500, 3000, 1644], 4096, seed=2)).to("cuda")
    model.train()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = loss_sum(model, batch)
    (loss / batch.num_trained).backward()
    torch.cuda.synchronize()
    peak = (torch.cuda.max_memory_allocated() - before) / GIB
    grads = [p.grad.float().norm() for p in model.parameters() if p.grad is not None]
    return peak, loss.item(), torch.stack(grads).norm().item()


def test_tiled_mlp_backward_lowers_the_peak_at_8b_width():
    whole = _one_layer_8b_step(tile_mlp=False)
    torch.cuda.empty_cache()
    tiled = _one_layer_8b_step(tile_mlp=True)
    assert abs(tiled[1] - whole[1]) < 1e-3 * abs(whole[1]), f"loss {tiled[1]} tiled vs {whole[1]} whole"
    assert abs(tiled[2] - whole[2]) < 2e-2 * whole[2], f"LoRA grad norm {tiled[2]} tiled vs {whole[2]} whole"
    # 8,192 tokens x 12,288: gate, up and their product are 192 MiB each, their gradients as much again; tiles of
    # 2,560 tokens hold under a third of that.
    assert tiled[0] < whole[0] - 0.4, f"peak above the model: {tiled[0]:.2f} GiB tiled vs {whole[0]:.2f} GiB whole"
