"""Idefics3 / SmolVLM patch positions for images whose every patch is real, computed on the host by transformers' own
embeddings code (hone.core.vision.host_merge.every_patch_positions): the same ids and embeddings as the module's
forward on the device, for any image size and dtype, and nothing read back from the device to get them (transformers
5.17's forward fills them through boolean-mask indexing)."""

from __future__ import annotations

import pytest
import torch
from host_reads import HostReads
from transformers import Idefics3VisionConfig
from transformers.models.idefics3.modeling_idefics3 import Idefics3VisionEmbeddings

from hone.core.vision.host_merge import every_patch_positions

SIDE, PATCH = 56, 14  # the tiny family's image_size and patch_size: 4 patches a side


@pytest.fixture(scope="module")
def embeddings():
    torch.manual_seed(0)
    config = Idefics3VisionConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        image_size=SIDE,
        patch_size=PATCH,
    )
    return Idefics3VisionEmbeddings(config).eval()


def device_forward(embeddings, pixels):
    """transformers' forward with every patch real, and the position ids it computed."""
    seen = []
    handle = embeddings.position_embedding.register_forward_pre_hook(lambda module, args: seen.append(args[0]))
    try:
        every_patch = torch.ones(
            (pixels.shape[0], pixels.shape[2] // PATCH, pixels.shape[3] // PATCH), dtype=torch.bool
        )
        out = embeddings(pixel_values=pixels, patch_attention_mask=every_patch)
    finally:
        handle.remove()
    return out, seen[0]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("height_width", [(56, 56), (42, 56), (28, 14), (84, 42), (14, 98)])
def test_host_positions_are_transformers_own(embeddings, dtype, height_width):
    pixels = torch.randn(3, 3, *height_width).to(dtype)
    module = embeddings.to(dtype)
    expected_out, expected_ids = device_forward(module, pixels)
    ids = every_patch_positions(module, pixels.shape, pixels.dtype)
    assert ids.dtype == expected_ids.dtype and torch.equal(ids, expected_ids)
    out = module.patch_embedding(pixels).flatten(2).transpose(1, 2) + module.position_embedding(ids)
    torch.testing.assert_close(out, expected_out, rtol=0, atol=0)


def test_the_encoder_reads_nothing_from_the_device_and_matches_transformers(smollm2_tokenizer_dir):
    """Hone's Idefics3 encoder path (every pixel real): the features of transformers' own `get_image_features`, and
    no read a GPU would wait for outside the host-side position code."""
    from hone.core.vision import tiny
    from hone.core.vision.host_merge import HostImages, _flat, _idefics3_features

    model = tiny.build_vision_model("idefics3", tiny.vision_tokenizer("idefics3", smollm2_tokenizer_dir)).eval()
    pixels = torch.randn(2, 1, 3, SIDE, SIDE)
    with torch.no_grad(), HostReads(host_code=[every_patch_positions]) as seen:
        features = _idefics3_features(model.model, HostImages(pixel_values=pixels, positions=torch.arange(0)))
    assert seen.found == []
    with torch.no_grad():
        out = model.model.get_image_features(
            pixel_values=pixels, pixel_attention_mask=torch.ones((2, 1, SIDE, SIDE), dtype=torch.bool)
        )
    torch.testing.assert_close(features, _flat(getattr(out, "pooler_output", out)), rtol=1e-6, atol=1e-6)
