"""The frozen vocabulary tables in host memory: batches carry their input rows looked up by the collation, the
chunked loss reads the LM head brought over once per call, training gives the same loss and gradients, other
callers still get right answers, and the run's end puts the tables back (tied ones still tied).

The tables are moved on real GPUs only; `force=True` runs the same bookkeeping on the CPU."""

from __future__ import annotations

import torch

from hone.core.config import RunConfig, SpeedConfig
from hone.core.models.shapes import build_model
from hone.core.speed.host_tables import HostEmbedding, HostLMHead, apply_host_tables
from hone.core.train.loss import loss_sum
from tests.helpers.offload import lora_model, packed_batch


def _model(shape="tiny-llama"):
    return lora_model(build_model(shape), rank=4)


def _loss_and_grads(model, batch):
    model.train()
    loss = loss_sum(model, batch, mode="chunked", fused=False)
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}
    model.zero_grad(set_to_none=True)
    return loss.detach(), grads


def _vocabulary_sized(model, table) -> int:
    return sum(p.numel() == table.numel() for p in model.parameters())


def _train_through_host_tables(shape: str):
    """(model, tables, the tables' device copies): both tables moved, training checked bit for bit against the
    model before the move."""
    model = _model(shape)
    batch = packed_batch([23, 41, 9])
    want_loss, want = _loss_and_grads(model, batch)
    embedding = model.get_input_embeddings().weight.detach().clone()
    head = model.get_output_embeddings().weight.detach().clone()

    tables = apply_host_tables(model, "cpu", force=True)
    assert isinstance(tables.embedding, HostEmbedding) and model.get_input_embeddings() is tables.embedding
    assert isinstance(tables.head, HostLMHead) and model.get_output_embeddings() is tables.head
    assert tables.embedding.original.weight.numel() == 0 and tables.head.original.weight.numel() == 0
    assert _vocabulary_sized(model, embedding) == 0, "no vocabulary-sized parameter is left on the device"
    batch.input_rows = tables.embedding.rows(batch.input_ids)
    assert "inputs_embeds" in batch.model_inputs() and "input_ids" not in batch.model_inputs()
    got_loss, got = _loss_and_grads(model, batch)
    assert torch.equal(got_loss, want_loss)
    assert all(torch.equal(got[n], g) for n, g in want.items())

    model.eval()
    with torch.no_grad():  # evaluation: the loss without gradients reads the same head
        torch.testing.assert_close(loss_sum(model, batch, mode="chunked", fused=False), want_loss)
    return model, tables, embedding, head


def test_untied_tables_in_host_memory_train_like_the_tables_on_the_device():
    model, tables, embedding, head = _train_through_host_tables("tiny-llama")
    assert tables.head.table is not tables.embedding.table

    # Callers without prepared rows (generation, say) still get right answers from both stand-ins.
    ids = torch.tensor([[5, 0, 48000]])
    torch.testing.assert_close(model.get_input_embeddings()(ids), embedding[ids])
    hidden = torch.randn(3, head.shape[1])
    torch.testing.assert_close(model.get_output_embeddings()(hidden), hidden @ head.t())

    tables.restore(model)
    assert isinstance(model.get_input_embeddings(), torch.nn.Embedding)
    assert torch.equal(model.get_input_embeddings().weight, embedding)
    assert type(model.get_output_embeddings()) is torch.nn.Linear
    assert torch.equal(model.get_output_embeddings().weight, head)
    tables.restore(model)  # a second restore (the trainer's close after an error, say) changes nothing
    assert torch.equal(model.get_output_embeddings().weight, head)


def test_a_tied_table_moves_once_and_comes_back_tied():
    model, tables, embedding, _ = _train_through_host_tables("tiny-dense")
    assert tables.head.table is tables.embedding.table, "one host copy serves both places"
    tables.restore(model)
    restored_in, restored_out = model.get_input_embeddings(), model.get_output_embeddings()
    assert restored_out.weight is restored_in.weight and torch.equal(restored_in.weight, embedding)


def test_tables_stay_on_the_device_with_the_reason():
    on_cpu = apply_host_tables(_model(), "cpu")
    assert "GPU" in on_cpu.embedding and "GPU" in on_cpu.head

    tied_head_off = apply_host_tables(_model("tiny-dense"), "cuda", head=False)
    assert "speed.host_lm_head = false" in tied_head_off.head
    assert "tied" in tied_head_off.embedding and "host_lm_head" in tied_head_off.embedding

    plain_loss = apply_host_tables(_model("tiny-dense"), "cuda", chunked_loss=False)
    assert "chunked" in plain_loss.head and "tied" in plain_loss.embedding

    trained = _model()
    trained.get_input_embeddings().weight.requires_grad_(True)
    trained.get_output_embeddings().weight.requires_grad_(True)
    reasons = apply_host_tables(trained, "cuda", force=True)
    assert "trained" in reasons.embedding and "trained" in reasons.head

    untied_head_off = apply_host_tables(_model(), "cpu", head=False, force=True)
    assert isinstance(untied_head_off.embedding, HostEmbedding), "an untied input table moves on its own"
    assert "host_lm_head" in untied_head_off.head


def test_the_trainer_collation_attaches_rows_and_close_restores():
    """StepRunner.collate looks the rows up when the setup holds a host table; close() puts the tables back."""
    from hone.core.speed.paths import SpeedSetup
    from hone.core.train.step import StepRunner

    model = _model()
    tables = apply_host_tables(model, "cpu", force=True)
    host = tables.embedding
    setup = SpeedSetup(host_tables=tables)
    tokenizer = type("Tok", (), {"pad_token_id": 0})()
    runner = StepRunner(
        model, tokenizer, None, None, None, [], RunConfig(speed=SpeedConfig()), "cpu", torch.float32, setup
    )
    rows = packed_batch([7, 5])
    batch = runner.collate(
        [type("Row", (), {"input_ids": rows.input_ids[0, :7].tolist(), "labels": rows.input_ids[0, :7].tolist()})()]
    )
    torch.testing.assert_close(batch.input_rows, host.table[batch.input_ids])
    runner.close()
    assert isinstance(model.get_input_embeddings(), torch.nn.Embedding)
    assert type(model.get_output_embeddings()) is torch.nn.Linear
