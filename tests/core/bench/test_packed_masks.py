"""The benchmark's reference and Hone's "every path off" run compute each packed sequence's own loss, also on
gpt-oss, whose own masks let a packed row's sequences attend to one another."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from hone.core.bench.batch import make_batch
from hone.core.bench.hone_runner import HoneRunner
from hone.core.bench.packed_masks import block_mask_mapping, packed_sequences_cross
from hone.core.bench.scenarios import get_scenario
from hone.core.bench.transformers_peft import ReferenceRunner
from hone.core.bench.variants import VARIANTS
from tests.helpers.packed import model_of

pytestmark = pytest.mark.core

# Rows of 8 to 40 tokens: most are past the tiny gpt-oss shape's 8-token window, so both layer types matter.
TOKENS, MIN_LEN, MAX_LEN = 96, 8, 40


def _batch(vocab: int):
    return make_batch(TOKENS, vocab, seed=3, min_len=MIN_LEN, max_len=MAX_LEN)


@torch.no_grad()
def _sequences_loss(model, batch) -> float:
    """Each sequence of the packed row run on its own (the model's own causal mask is then right), the token
    losses summed and divided by the trained tokens: what the packed row's loss must equal."""
    flat = batch.flattened()
    ids, labels = torch.from_numpy(flat["input_ids"][0]), torch.from_numpy(flat["labels"][0])
    total, count, start = 0.0, 0, 0
    for length in batch.lengths:
        seq_ids, seq_labels = ids[start : start + length], labels[start : start + length]
        logits = model(input_ids=seq_ids[None], use_cache=False).logits[0, :-1].float()
        total += float(F.cross_entropy(logits, seq_labels[1:], ignore_index=-100, reduction="sum"))
        count += int((seq_labels[1:] != -100).sum())
        start += length
    return total / count


def test_gptoss_masks_cross_packed_sequences_and_llama_masks_keep_them_apart():
    assert packed_sequences_cross(model_of("tiny-moe-gptoss"))
    assert not packed_sequences_cross(model_of("tiny-llama"))


def test_the_mapping_keeps_each_sequence_to_itself_within_each_layer_window():
    model = model_of("tiny-moe-gptoss")
    positions = torch.tensor([[0, 1, 2, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10]])
    masks = block_mask_mapping(model, positions)
    assert set(masks) == set(model.config.layer_types)
    sees = {kind: mask[0, 0] > torch.finfo(mask.dtype).min / 2 for kind, mask in masks.items()}  # eager: additive
    window = model.config.sliding_window
    for kind, allowed in sees.items():
        for q in range(14):
            for k in range(14):
                same = (q < 3) == (k < 3)
                want = same and k <= q and (kind == "full_attention" or q - k < window)
                assert bool(allowed[q, k]) == want, (kind, q, k)


def test_reference_and_hone_base_first_loss_is_each_sequences_own_loss_on_gptoss():
    scenario = get_scenario("tiny-moe-gptoss")
    reference = ReferenceRunner(
        "reference", scenario, None, _batch(model_of("tiny-moe-gptoss").config.vocab_size),
        lora_r=4, seed=0, dtype=torch.float32, device="cpu",
    )  # fmt: skip
    reference.setup()
    want = _sequences_loss(reference.model, reference.batch)  # LoRA's B starts at zero: the base model's loss
    with torch.no_grad():
        got = float(reference._loss())
    assert got == pytest.approx(want, rel=1e-6, abs=1e-6)
    assert "per-sequence" in reference.describe()["speed_paths"]["attention"]

    base = next(v for v in VARIANTS if v.name == "hone-base")
    hone = HoneRunner(base, scenario, None, reference.batch, lora_r=4, seed=0, dtype=torch.float32, device="cpu")
    hone.setup()
    assert "sdpa" in hone.describe()["speed_paths"]["attention"]
    assert hone.step().loss == pytest.approx(want, rel=1e-6, abs=1e-6)
    reference.teardown()
    hone.teardown()


def test_reference_keeps_the_models_own_masks_where_they_keep_sequences_apart():
    scenario = get_scenario("tiny-llama")
    reference = ReferenceRunner(
        "reference", scenario, None, _batch(model_of("tiny-llama").config.vocab_size),
        lora_r=4, seed=0, dtype=torch.float32, device="cpu",
    )  # fmt: skip
    reference.setup()
    assert "attention_mask" not in reference.inputs
    with torch.no_grad():
        assert float(reference._loss()) == pytest.approx(_sequences_loss(reference.model, reference.batch), rel=1e-5)
    reference.teardown()
