"""The static-cache sampler decodes what transformers' `generate` decodes (greedy, left-padded prompts of
different lengths, sliding-window and sink layers, MoE), its draws follow the temperature / top-p distribution,
and on a GPU its decode step is captured once and replayed."""

from __future__ import annotations

import pytest
import torch

from hone.core.models.shapes import build_model
from hone.core.speed.static_sampling import PROMPT_BUCKET, StaticSampler, layout, sample_next

pytestmark = pytest.mark.core

GREEDY = 1e-9  # a top_p this small keeps only the most likely token: sampling becomes argmax


def _prompts(vocab: int, lengths=(5, 9, 3, 12), seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    pad = 0
    width = max(lengths)
    ids = torch.full((len(lengths), width), pad, dtype=torch.long)
    mask = torch.zeros((len(lengths), width), dtype=torch.long)
    for i, n in enumerate(lengths):
        ids[i, width - n :] = torch.randint(1, vocab, (n,), generator=g)
        mask[i, width - n :] = 1
    return ids, mask


@pytest.mark.parametrize("shape", ["tiny-dense", "tiny-llama", "tiny-moe-qwen3", "tiny-moe-gptoss"])
def test_greedy_static_decoding_equals_generate(shape):
    model = build_model(shape, seed=1).eval()
    ids, mask = _prompts(model.config.vocab_size)
    eos = [model.config.vocab_size - 1]
    with torch.no_grad():
        want = model.generate(
            input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=20, pad_token_id=0, eos_token_id=eos
        )[:, ids.shape[1] :]
    got = StaticSampler().sample(
        model, ids, mask, max_new_tokens=20, temperature=1.0, top_p=GREEDY, pad_id=0, eos_ids=eos
    )
    assert got.shape == want.shape
    assert torch.equal(got, want)


def test_a_window_shorter_than_the_answer_is_kept_on_sliding_layers():
    """gpt-oss' sliding layers see only the last `sliding_window` positions: a window shorter than prompt +
    answer must change nothing against generate, which builds its own window masks."""
    model = build_model("tiny-moe-gptoss", seed=2, sliding_window=4).eval()
    assert layout(model).windows["sliding_attention"] == 4
    ids, mask = _prompts(model.config.vocab_size, lengths=(7, 2))
    with torch.no_grad():
        want = model.generate(
            input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=12, pad_token_id=0, eos_token_id=[-1]
        )[:, ids.shape[1] :]
    got = StaticSampler().sample(
        model, ids, mask, max_new_tokens=12, temperature=1.0, top_p=GREEDY, pad_id=0, eos_ids=[-1]
    )
    assert torch.equal(got, want)


def test_rows_end_at_their_first_end_of_text_and_the_answer_is_cut_where_all_ended():
    model = build_model("tiny-dense", seed=1).eval()
    ids, mask = _prompts(model.config.vocab_size)
    free = StaticSampler().sample(
        model, ids, mask, max_new_tokens=8, temperature=1.0, top_p=GREEDY, pad_id=0, eos_ids=[-1]
    )
    eos = int(free[0, 2])  # make row 0's third greedy token the end of text
    got = StaticSampler().sample(
        model, ids, mask, max_new_tokens=8, temperature=1.0, top_p=GREEDY, pad_id=0, eos_ids=[eos]
    )
    for row_free, row in zip(free.tolist(), got.tolist()):
        end = row_free.index(eos) if eos in row_free else len(row_free)
        assert row[: end + 1] == row_free[: end + 1]
        assert all(t == 0 for t in row[end + 1 :])
    # every row ends at once: the answer stops at the first check instead of running to max_new_tokens
    first = int(free[0, 0])
    everyone = StaticSampler().sample(
        model, ids[:1], mask[:1], max_new_tokens=200, temperature=1.0, top_p=GREEDY, pad_id=0, eos_ids=[first]
    )
    assert everyone.shape[1] <= 16 and everyone[0, 0] == first


def test_prompts_are_padded_to_a_bucket_so_later_steps_reuse_the_shapes():
    model = build_model("tiny-dense", seed=1).eval()
    ids, mask = _prompts(model.config.vocab_size, lengths=(3, PROMPT_BUCKET + 1))
    got = StaticSampler().sample(
        model, ids, mask, max_new_tokens=4, temperature=1.0, top_p=GREEDY, pad_id=0, eos_ids=[-1]
    )
    with torch.no_grad():
        want = model.generate(
            input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=4, pad_token_id=0, eos_token_id=[-1]
        )[:, ids.shape[1] :]
    assert torch.equal(got, want)


def test_draws_follow_temperature_and_top_p():
    torch.manual_seed(0)
    logits = torch.tensor([[2.0, 1.0, 0.5, -1.0, -3.0]]).repeat(40_000, 1)
    for temperature, top_p in [(1.0, 1.0), (0.7, 1.0), (1.3, 0.8)]:
        scaled = torch.softmax(logits[0] / temperature, -1)
        order = scaled.argsort(descending=True)
        keep = torch.zeros_like(scaled, dtype=torch.bool)
        keep[order[(scaled[order].cumsum(0) - scaled[order]) < top_p]] = True
        want = torch.where(keep, scaled, 0.0)
        want = want / want.sum()
        draws = sample_next(logits, temperature, top_p)
        seen = torch.bincount(draws, minlength=5).double() / len(draws)
        assert torch.allclose(seen, want.double(), atol=0.01), (temperature, top_p, seen, want)


def test_the_model_keeps_its_mode():
    model = build_model("tiny-dense", seed=1).train()
    ids, mask = _prompts(model.config.vocab_size)
    StaticSampler().sample(model, ids, mask, max_new_tokens=2, temperature=1.0, top_p=1.0, pad_id=0, eos_ids=[-1])
    assert model.training


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("shape", ["tiny-dense", "tiny-llama"])
def test_the_decode_step_is_captured_once_and_replays_what_eager_decoding_gives(shape):
    model = build_model(shape, seed=1, device="cuda").eval()
    ids, mask = (t.cuda() for t in _prompts(model.config.vocab_size))
    eager = StaticSampler(capture=False).sample(
        model, ids, mask, max_new_tokens=24, temperature=1.0, top_p=GREEDY, pad_id=0, eos_ids=[-1]
    )
    sampler = StaticSampler()
    captured = sampler.sample(
        model, ids, mask, max_new_tokens=24, temperature=1.0, top_p=GREEDY, pad_id=0, eos_ids=[-1]
    )
    assert sampler.capture_problem is None
    assert sampler.captured_steps == 24 - 2  # token 1: the prefill, 2: the warm-up, then replays
    assert torch.equal(captured, eager)


def test_float32_adapters_on_a_bf16_model_sample_in_bf16_and_come_back_untouched():
    """peft keeps LoRA factors in float32 on a bf16 model; while sampling they run in bf16 (no float32 casts and
    matmuls per token), and afterwards the parameters hold their own float32 tensors again, bit for bit."""
    from peft import LoraConfig, get_peft_model

    from hone.core.speed.static_sampling import adapters_in_compute_dtype

    model = get_peft_model(
        build_model("tiny-dense", seed=3).to(torch.bfloat16), LoraConfig(r=4, target_modules="all-linear")
    ).eval()
    factors = {n: p for n, p in model.named_parameters() if "lora_" in n}
    assert factors and {p.dtype for p in factors.values()} == {torch.float32}
    before = {n: (p.data, p.detach().clone()) for n, p in factors.items()}
    seen = []
    layer = model.base_model.model.model.layers[0].self_attn.q_proj
    handle = layer.register_forward_pre_hook(lambda m, _a: seen.append(m.lora_A["default"].weight.dtype))
    ids, mask = _prompts(model.config.vocab_size)
    StaticSampler().sample(model, ids, mask, max_new_tokens=4, temperature=1.0, top_p=1.0, pad_id=0, eos_ids=[-1])
    handle.remove()
    assert seen and set(seen) == {torch.bfloat16}
    for name, p in factors.items():
        data, values = before[name]
        assert p.data_ptr() == data.data_ptr(), name
        assert p.dtype == torch.float32 and torch.equal(p.detach(), values), name
    with adapters_in_compute_dtype(build_model("tiny-dense", seed=3)) as cast:  # nothing to cast: no adapter
        assert cast == 0


def test_a_cast_made_of_a_sampling_copy_does_not_outlive_it():
    """Sampling happens inside the trainer's `reuse_weight_casts` block: a scaled bf16 cast of a factor made while the
    factor held its bf16 copy rounds twice, and the step's training passes must get the cast of the float32 values."""
    from peft import LoraConfig, get_peft_model

    from hone.core.speed.static_sampling import adapters_in_compute_dtype
    from hone.kernels.weight_casts import cast_weight, reuse_weight_casts

    model = get_peft_model(
        build_model("tiny-dense", seed=3).to(torch.bfloat16), LoraConfig(r=4, target_modules="all-linear")
    )
    factor = model.base_model.model.model.layers[0].self_attn.q_proj.lora_B["default"].weight
    with torch.no_grad():
        factor.copy_(torch.randn(factor.shape, generator=torch.Generator().manual_seed(0)))
    want = torch.mul(factor.detach(), 0.3).to(torch.bfloat16)
    with reuse_weight_casts():
        with adapters_in_compute_dtype(model):
            during = cast_weight(factor, torch.bfloat16, 0.3)
        assert not torch.equal(during, want), "the copy's cast rounds twice (else this test tells nothing)"
        assert torch.equal(cast_weight(factor, torch.bfloat16, 0.3), want)
