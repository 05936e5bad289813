"""The Qwen-VL image encoder on Hone's varlen attention: transformers' flash branch hands the whole batch and its
cu_seqlens to `encoder_attention`, which gives what transformers' own SDPA loop over images and windows gives. On
the CPU, torch's varlen kernel (CUDA only) is replaced by a per-segment SDPA reference; the GPU test uses the kernel.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from hone.core.speed.attention import vision_encoder
from hone.core.vision import tiny
from tests.helpers.packed import bidirectional_varlen

QWEN_KINDS = ("qwen2_5_vl", "qwen3_vl")


def encoder_inputs(model, grid: list[list[int]], seed: int = 0):
    """Random flattened patches of images with the given (t, h, w) patch grids, as the processor lays them out."""
    vision = model.config.vision_config
    per_patch = vision.in_channels * vision.temporal_patch_size * vision.patch_size**2
    grid_thw = torch.tensor(grid)
    patches = int(grid_thw.prod(-1).sum())
    return torch.randn(patches, per_patch, generator=torch.Generator().manual_seed(seed)), grid_thw


@pytest.mark.parametrize("kind", QWEN_KINDS)
def test_one_varlen_call_per_layer_equals_transformers_loop(kind, smollm2_tokenizer_dir, monkeypatch):
    from torch.nn.attention import varlen

    calls = []

    def counted(*args, **kwargs):
        calls.append(int(args[3].numel()) - 1)  # segments in the call
        return bidirectional_varlen(*args, **kwargs)

    monkeypatch.setattr(varlen, "varlen_attn", counted)
    model = tiny.build_vision_model(kind, tiny.vision_tokenizer(kind, smollm2_tokenizer_dir)).eval()
    visual = model.model.visual
    pixels, grid = encoder_inputs(model, [[1, 4, 8], [1, 8, 4], [1, 4, 4]])
    # the language model's packed metadata, which some transformers releases pass on to the encoder
    text_kwargs = dict(cu_seq_lens_q=torch.tensor([0, 9], dtype=torch.int32), max_length_q=9)
    text_kwargs.update(cu_seq_lens_k=text_kwargs["cu_seq_lens_q"], max_length_k=9)
    with torch.no_grad():
        want = visual(pixels, grid_thw=grid).pooler_output
        previous = vision_encoder.apply_encoder_attention(model)
        got = visual(pixels, grid_thw=grid).pooler_output
        with_text_kwargs = visual(pixels, grid_thw=grid, **text_kwargs).pooler_output
    assert previous == "sdpa" and model.config.vision_config._attn_implementation == "hone_flash_varlen_encoder"
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(with_text_kwargs, want, rtol=1e-5, atol=1e-5)
    layers = len(visual.blocks)
    assert len(calls) == 2 * layers, "one call per layer for all the images"
    assert max(calls) >= 3, calls  # every image (or window) of the batch in the same call
    vision_encoder.revert_encoder_attention(model, previous)
    assert model.config.vision_config._attn_implementation == "sdpa"
    assert not visual._forward_pre_hooks, "the revert removes the hook"


def test_without_cu_seqlens_it_is_plain_bidirectional_attention():
    """A transformers that still loops over segments calls it once per segment, without cu_seqlens."""
    q, k, v = (torch.randn(1, 2, 7, 8, generator=torch.Generator().manual_seed(i)) for i in range(3))
    out, weights = vision_encoder.encoder_attention(torch.nn.Module(), q, k, v, None, scaling=0.3)
    assert weights is None and out.shape == (1, 7, 2, 8)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, scale=0.3).transpose(1, 2))


def test_encoders_without_cu_seqlens_are_left_alone(smollm2_tokenizer_dir):
    model = tiny.build_vision_model("llava", tiny.vision_tokenizer("llava", smollm2_tokenizer_dir))
    assert vision_encoder.apply_encoder_attention(model) is None
    assert model.config.vision_config._attn_implementation != vision_encoder.VISION_IMPLEMENTATION


@pytest.mark.gpu
@pytest.mark.parametrize("kind", QWEN_KINDS)
def test_on_the_gpu_the_encoder_takes_torch_varlen_and_configure_installs_it(kind, smollm2_tokenizer_dir):
    """bf16 on CUDA: torch's varlen kernel gives the encoder output transformers' SDPA loop gives (to bf16
    rounding), and the run's attention choice puts the encoder on it and says so."""
    from hone.core.config import SpeedConfig
    from hone.core.speed import attention

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    model = tiny.build_vision_model(
        kind, tiny.vision_tokenizer(kind, smollm2_tokenizer_dir), dtype=torch.bfloat16, device="cuda"
    ).eval()
    pixels, grid = encoder_inputs(model, [[1, 4, 8], [1, 8, 4], [1, 4, 4]])
    pixels, grid = pixels.to("cuda", torch.bfloat16), grid.to("cuda")
    with torch.no_grad():
        want = model.model.visual(pixels, grid_thw=grid).pooler_output.float()
    choice = attention.configure(model, SpeedConfig(attention="auto"), "cuda")  # (its varlen probe runs backward)
    with torch.no_grad():
        got = model.model.visual(pixels, grid_thw=grid).pooler_output.float()
    assert choice.name == "varlen" and "image encoder with all images and windows in one call" in choice.reason
    assert model.config.vision_config._attn_implementation == vision_encoder.VISION_IMPLEMENTATION
    assert ((got - want).norm() / want.norm()).item() < 2e-2
    attention.revert(model, choice)
    assert model.config.vision_config._attn_implementation == choice.encoder_previous
