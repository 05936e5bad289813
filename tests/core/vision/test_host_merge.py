"""Packed vision rows on Hone's path merge their images at positions the collator found on the host
(hone.core.vision.host_merge): the same loss and gradients as transformers' own merge, and nothing in forward +
backward that would make the host wait on a GPU (checked here by recording such reads, see host_reads.py)."""

from __future__ import annotations

import copy

import pytest
import torch
from host_reads import HostReads
from test_vision_batches import _grads, collator, encode
from vision_helpers import KINDS, PACKED_KINDS

from hone.core.config import SpeedConfig
from hone.core.speed import attention
from hone.core.speed.attention import packed_metadata, vision_encoder
from hone.core.train.loss import loss_sum
from hone.core.vision import host_merge
from tests.helpers.packed import assert_grads_close, bidirectional_varlen


@pytest.fixture
def on_hone_path(vision_kit, mixed_rows, monkeypatch):
    """on_hone_path(kind) -> (model, collator, tokenized rows): a copy of the tiny model with Hone's packed
    attention configured as on a GPU (the image encoder on varlen, torch's CUDA kernel replaced by a per-segment
    reference), which installs the merge."""
    from torch.nn.attention import varlen

    monkeypatch.setattr(varlen, "varlen_attn", bidirectional_varlen)
    made = []

    def make(kind):
        processor, tiny_model = vision_kit(kind)
        model = copy.deepcopy(tiny_model)
        choice = attention.configure(model, SpeedConfig(attention="auto"), "cpu")
        previous = vision_encoder.apply_encoder_attention(model)
        made.append((model, choice, previous))
        assert choice.host_merge, choice
        folder, rows = mixed_rows
        return model, collator(processor, model, packing=True), encode(processor, folder, rows)

    yield make
    for model, choice, previous in made:
        vision_encoder.revert_encoder_attention(model, previous)
        attention.revert(model, choice)


def _step(model, batch):
    model.zero_grad(set_to_none=True)
    loss = loss_sum(model, batch, mode="plain")
    loss.backward()
    return loss.detach(), _grads(model)


@pytest.mark.parametrize("kind", PACKED_KINDS)
def test_the_merge_trains_like_transformers_own(kind, on_hone_path):
    model, make, tokenized = on_hone_path(kind)
    merged = make.collate(tokenized)
    assert merged.image_positions is not None and "hone_images" in merged.model_inputs()
    assert "pixel_values" not in merged.model_inputs()
    host_merge.uninstall(model)
    plain = make.collate(tokenized)  # the same rows for transformers' merge: pixels in the model call
    assert plain.image_positions is None and "pixel_values" in plain.model_inputs()
    loss_plain, grads_plain = _step(model, plain)
    assert host_merge.install(model)
    loss_merged, grads_merged = _step(model, merged)
    torch.testing.assert_close(loss_merged, loss_plain, rtol=1e-6, atol=0)
    assert_grads_close(grads_merged, grads_plain, rtol=1e-5, rel_atol=1e-6)
    with torch.no_grad():  # the Trainer's chunked loss calls the model body: the merge is there too
        torch.testing.assert_close(loss_sum(model, merged, mode="chunked"), loss_plain, rtol=1e-5, atol=0)


@pytest.mark.parametrize("kind", PACKED_KINDS)
def test_forward_and_backward_read_nothing_back_from_the_device(kind, on_hone_path):
    """With the merge, no read a GPU would wait for; transformers' own merge of the same rows makes some (so the
    check sees them). Allowed: the image grid (it stays on the host), the encoder metadata built from it there, and
    the CPU stand-ins for the CUDA attention kernels."""
    model, make, tokenized = on_hone_path(kind)
    merged = make.collate(tokenized)
    host_code = [host_merge._qwen_encoder_metadata, bidirectional_varlen, packed_metadata._shared_lengths]

    def reads(batch):
        with HostReads(
            host=[batch.pixels[k] for k in ("image_grid_thw",) if k in batch.pixels], host_code=host_code
        ) as seen:
            loss_sum(model, batch, mode="plain").backward()
        return seen.found

    assert reads(merged) == []
    host_merge.uninstall(model)
    assert reads(make.collate(tokenized)), "transformers' merge reads the device; the check should see it"


def test_revert_takes_the_merge_off(vision_kit, mixed_rows):
    processor, tiny_model = vision_kit("qwen2_5_vl")
    model = copy.deepcopy(tiny_model)
    choice = attention.configure(model, SpeedConfig(attention="auto"), "cpu")
    assert host_merge.installed(model.config) and "forward" in vars(model.model)
    twin = copy.deepcopy(model)  # a copy's merge runs the copy's own modules
    assert vars(twin.model)["forward"].inner is twin.model
    attention.revert(model, choice)
    assert not host_merge.installed(model.config) and "forward" not in vars(model.model)
    folder, rows = mixed_rows
    batch = collator(processor, model, packing=True).collate(encode(processor, folder, rows))
    assert batch.image_positions is None and "pixel_values" in batch.model_inputs()


def test_a_padded_family_keeps_transformers_merge(vision_kit):
    """Gemma 3 trains on padded rows with transformers' masks: nothing is installed on it."""
    if "gemma3" not in KINDS:
        pytest.skip("Gemma 3's processor cannot be built here")
    _, tiny_model = vision_kit("gemma3")
    model = copy.deepcopy(tiny_model)
    assert host_merge.install(model) is False
    assert not host_merge.installed(model.config) and "forward" not in vars(model.model)
