"""The frozen input-embedding table in host memory: batches carry their rows looked up by the collation, training
gives the same loss and gradients, other callers still get right answers, and the run's end puts the table back.

The table is moved on real GPUs only; `force=True` runs the same bookkeeping on the CPU."""

from __future__ import annotations

import torch
from offload_helpers import lora_model, packed_batch

from hone.core.config import RunConfig, SpeedConfig
from hone.core.host_embedding import HostEmbedding, apply_host_embedding, unsupported_reason
from hone.core.loss import loss_sum
from hone.core.shapes import build_model


def _model(shape="tiny-llama"):
    return lora_model(build_model(shape), rank=4)


def _loss_and_grads(model, batch):
    model.train()
    loss = loss_sum(model, batch, mode="chunked", fused=False)
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}
    model.zero_grad(set_to_none=True)
    return loss.detach(), grads


def test_rows_from_the_host_table_train_like_the_embedding_on_the_device():
    model = _model()
    batch = packed_batch([23, 41, 9])
    want_loss, want = _loss_and_grads(model, batch)
    table = model.get_input_embeddings().weight.detach().clone()

    host = apply_host_embedding(model, "cpu", force=True)
    assert isinstance(host, HostEmbedding) and model.get_input_embeddings() is host
    assert host.original.weight.numel() == 0, "the device copy of the table is given up"
    tables = sum(p.numel() == table.numel() for p in model.parameters())
    assert tables == 1, "only the (untied) LM head holds a vocabulary-sized weight now"
    batch.input_rows = host.rows(batch.input_ids)
    assert "inputs_embeds" in batch.model_inputs() and "input_ids" not in batch.model_inputs()
    got_loss, got = _loss_and_grads(model, batch)
    assert torch.equal(got_loss, want_loss)
    assert all(torch.equal(got[n], g) for n, g in want.items())

    # A call without prepared rows (generation, say) looks the ids up itself.
    ids = torch.tensor([[5, 0, 48000]])
    torch.testing.assert_close(model.get_input_embeddings()(ids), table[ids])

    host.restore(model)
    restored = model.get_input_embeddings()
    assert isinstance(restored, torch.nn.Embedding) and torch.equal(restored.weight, table)


def test_tied_trained_or_cpu_tables_stay_where_they_are():
    assert "GPU" in unsupported_reason(_model(), "cpu")
    assert "tied" in unsupported_reason(_model("tiny-dense"), "cuda")
    trained = _model()
    trained.get_input_embeddings().weight.requires_grad_(True)
    assert "trained" in unsupported_reason(trained, "cuda")
    assert isinstance(apply_host_embedding(_model("tiny-dense"), "cuda"), str)


def test_the_trainer_collation_attaches_rows_and_close_restores():
    """StepRunner.collate looks the rows up when the setup holds a HostEmbedding; close() puts the table back."""
    from hone.core.speed import SpeedSetup
    from hone.core.trainer import StepRunner

    model = _model()
    host = apply_host_embedding(model, "cpu", force=True)
    setup = SpeedSetup(host_embedding=host)
    tokenizer = type("Tok", (), {"pad_token_id": 0})()
    runner = StepRunner(model, tokenizer, None, None, None, [], RunConfig(speed=SpeedConfig()), "cpu",
                        torch.float32, setup)
    rows = packed_batch([7, 5])
    batch = runner.collate([type("Row", (), {"input_ids": rows.input_ids[0, :7].tolist(),
                                            "labels": rows.input_ids[0, :7].tolist()})()])
    torch.testing.assert_close(batch.input_rows, host.table[batch.input_ids])
    runner.close()
    assert isinstance(model.get_input_embeddings(), torch.nn.Embedding) and setup.host_embedding is None
