"""The vocabulary tables in host memory on a CUDA GPU (`pytest -m gpu`): both tables' device memory is given back,
the trainer's collation brings each batch's rows along, the loss brings the head over and lets it go again,
training matches the tables on the device, and the collated path adds no host sync to the step."""

from __future__ import annotations

import itertools

import pytest
import torch

from hone.core.bench.measure import count_syncs
from hone.core.config import RunConfig, SpeedConfig
from hone.core.models.shapes import build_model
from hone.core.speed.host_tables import HostEmbedding, HostLMHead
from hone.core.speed.paths import SpeedSetup, install_memory_and_kernels
from hone.core.train.loss import loss_sum
from tests.helpers.offload import lora_model, packed_batch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def _rel(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got.float() - want.float()).norm() / want.float().norm().clamp_min(1e-30)).item()


def _loss_and_grads(model, batch):
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = loss_sum(model, batch.to("cuda"))
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}
    model.zero_grad(set_to_none=True)
    return loss.detach(), grads


def test_host_table_frees_its_memory_and_trains_the_same():
    from hone.core.models.load import count_params, info_from_config
    from hone.core.train.step import StepRunner

    torch.manual_seed(0)
    model = lora_model(build_model("dense-8b", layers=2, dtype=torch.bfloat16, device="cuda"), rank=8)  # untied
    model.train()
    rows = packed_batch([700, 300, 500], vocab=151936)
    on_device_rows = rows.to("cuda")
    # transformers' own attention (this test keeps it) may sync while building its mask: the host table must add none
    baseline_syncs = count_syncs(lambda: loss_sum(model, on_device_rows).backward(), "cuda")
    model.zero_grad(set_to_none=True)
    want_loss, want = _loss_and_grads(model, rows)
    _, again = _loss_and_grads(model, rows)  # bf16 kernels are not bit-reproducible: measure their noise
    noise = max(_rel(again[n], g) for n, g in want.items())
    tolerance = max(5e-3, 5 * noise)

    table_bytes = model.get_input_embeddings().weight.numel() * 2
    before = torch.cuda.memory_allocated()
    setup = SpeedSetup()
    config = RunConfig(speed=SpeedConfig(attention="hf", checkpoint="off", kernels=False))
    info = info_from_config(model.config, "dense-8b", "shape", count_params(model))
    install_memory_and_kernels(model, config.speed, info, "cuda", setup, mean_row_tokens=500.0)
    assert isinstance(setup.host_tables.embedding, HostEmbedding), setup.choices.get("embeddings")
    assert isinstance(setup.host_tables.head, HostLMHead), setup.choices.get("lm_head")
    torch.cuda.synchronize()
    moved = before - torch.cuda.memory_allocated()
    assert moved >= 2 * table_bytes, "the tables' device memory was not given back"

    tokenizer = type("Tok", (), {"pad_token_id": 0})()
    runner = StepRunner(model, tokenizer, None, None, None, [], config, "cuda", torch.bfloat16, setup)
    ids = rows.input_ids[0].tolist()
    bounds = [0, 700, 1000, 1500]
    batch = runner.collate(
        [type("Row", (), {"input_ids": ids[a:b], "labels": ids[a:b]})() for a, b in itertools.pairwise(bounds)]
    )
    assert batch.input_rows is not None and batch.input_rows.is_pinned()
    batch.targets = rows.targets  # the same targets as the reference (packed_batch draws random labels)
    got_loss, got = _loss_and_grads(model, batch)
    torch.testing.assert_close(got_loss, want_loss, rtol=1e-3, atol=1e-3)
    worst = max(want, key=lambda n: _rel(got[n], want[n]))
    assert _rel(got[worst], want[worst]) <= tolerance, (
        f"{worst}: relative error {_rel(got[worst], want[worst]):.2e}, noise floor {noise:.2e}"
    )

    torch.cuda.synchronize()
    assert torch.cuda.memory_allocated() < before - 2 * table_bytes + table_bytes // 4, (
        "the head's device copy outlived the step"
    )

    on_device = batch.to("cuda")
    syncs = count_syncs(lambda: loss_sum(model, on_device).backward(), "cuda")
    assert syncs == baseline_syncs, f"{syncs} host syncs with the host table, {baseline_syncs} with it on the device"
    runner.close()
    assert isinstance(model.get_input_embeddings(), torch.nn.Embedding)
    assert model.get_input_embeddings().weight.is_cuda and model.get_output_embeddings().weight.is_cuda


def test_the_head_copy_starts_with_the_forward_and_not_in_backward():
    """The head's copy to the GPU starts when the model's forward starts (side stream) and the loss takes it; a
    checkpointed layer recomputed in backward starts no copy."""
    from hone.core.models.load import count_params, info_from_config

    torch.manual_seed(0)
    model = lora_model(build_model("dense-8b", layers=2, dtype=torch.bfloat16, device="cuda"), rank=8)
    model.train()
    batch = packed_batch([300, 200], vocab=151936).to("cuda")
    want_loss, _ = _loss_and_grads(model, batch)
    setup = SpeedSetup()
    config = RunConfig(speed=SpeedConfig(checkpoint="gpu", kernels=False))
    info = info_from_config(model.config, "dense-8b", "shape", count_params(model))
    install_memory_and_kernels(model, config.speed, info, "cuda", setup, mean_row_tokens=250.0)
    head = setup.host_tables.head
    assert isinstance(head, HostLMHead) and len(head._hooks) == 1

    taken = []
    original = head.device_weight

    def device_weight(device):
        taken.append(head._pending is not None)  # a copy was under way when the loss asked for the weight
        return original(device)

    head.device_weight = device_weight
    got_loss, _ = _loss_and_grads(model, batch)
    assert taken == [True] and head._pending is None, "recompute in backward started another copy"
    torch.testing.assert_close(got_loss, want_loss, rtol=1e-3, atol=1e-3)
    setup.host_tables.restore(model)
    assert head._hooks == [] and model.get_output_embeddings().weight.is_cuda
