"""A CPU run's time estimate: its arithmetic against counts worked out by hand, the tokens a run trains on, the range
at a given rate, and the matmul probe that gives the rate."""

from __future__ import annotations

import pytest

from hone.core.memory.shape import ModelShape
from hone.core.memory.time_estimate import (
    EFFICIENCY_HIGH,
    EFFICIENCY_LOW,
    active_params,
    estimate_time,
    flops_per_token,
    measure_matmul_rate,
    run_tokens,
)

# 2 layers, hidden 64, MLP 128, 4 query heads and 2 key/value heads of 16, vocabulary 1000, untied head.
SMALL = ModelShape(
    layers=2, hidden=64, intermediate=128, heads=4, kv_heads=2, head_dim=16, vocab=1000, tied_embeddings=False
)
# The same with experts: 8 experts of 32, 2 per token, a shared expert of 32.
SMALL_MOE = ModelShape(
    layers=2,
    hidden=64,
    intermediate=128,
    heads=4,
    kv_heads=2,
    head_dim=16,
    vocab=1000,
    tied_embeddings=True,
    experts=8,
    top_k=2,
    expert_intermediate=32,
    shared_intermediate=32,
)


def test_active_parameters_by_hand():
    attention = 64 * 64 + 2 * 64 * 32 + 64 * 64  # q, k, v, o
    head = 1000 * 64  # the LM head multiplies every token, tied to the embedding or not
    assert active_params(SMALL) == 2 * (attention + 3 * 64 * 128) + head == 137728
    # a token runs 2 of the 8 experts, the router and the shared expert
    moe_mlp = 2 * 3 * 64 * 32 + 64 * 8 + 3 * 64 * 32
    assert active_params(SMALL_MOE) == 2 * (attention + moe_mlp) + head


def test_flops_per_token_by_hand():
    a, lora = 137728, SMALL.lora_params(4)
    attention = 4 * 2 * (4 * 16) * (256 / 2)  # QK^T and AV: 2 x 2 flops per head value per earlier token, 2 layers
    plain = flops_per_token(SMALL, lora_rank=4, mean_row_tokens=256)
    # forward 2A + attention; backward to the inputs of the frozen weights 2A + twice the attention; LoRA 6 per value
    assert plain == pytest.approx(2 * a + attention + 2 * a + 2 * attention + 6 * lora)
    recompute = flops_per_token(SMALL, lora_rank=4, mean_row_tokens=256, recompute=True)
    assert recompute - plain == pytest.approx(2 * a + attention + 2 * lora)  # one more forward
    reference = flops_per_token(SMALL, lora_rank=4, mean_row_tokens=256, reference_forward=True)
    assert reference - plain == pytest.approx(2 * a + attention)  # the frozen model's forward, without LoRA


def test_tokens_of_a_run_by_steps_or_epochs():
    assert run_tokens(max_steps=30, batch_tokens=2048, grad_accum=2, epochs=3.0) == 30 * 2048 * 2
    assert run_tokens(max_steps=0, batch_tokens=2048, grad_accum=1, epochs=2.5, tokens_per_epoch=10_000) == 25_000
    assert run_tokens(max_steps=0, batch_tokens=2048, grad_accum=1, epochs=1.0) is None  # the data is not counted


def test_the_range_at_a_given_rate():
    # 61,440 tokens at 1e9 flops each = 6.144e13 flops; the probe measured 1e11 flop/s
    estimate = estimate_time(61_440, 1e9, 1e11)
    assert estimate.flops == pytest.approx(6.144e13)
    assert estimate.low_s == pytest.approx(6.144e13 / (1e11 * EFFICIENCY_HIGH))
    assert estimate.high_s == pytest.approx(6.144e13 / (1e11 * EFFICIENCY_LOW))
    assert estimate.low_s < estimate.high_s
    with pytest.raises(ValueError):
        estimate_time(1, 1.0, 0.0)


def test_the_probe_measures_a_rate_once_per_process():
    rate = measure_matmul_rate()
    assert 1e8 < rate < 1e14  # any CPU from a netbook's to a server's, in float32 flop/s
    assert measure_matmul_rate() == rate  # cached: the second call measures nothing


def test_a_runs_estimate_from_its_config_and_plan():
    from hone.core.config import RunConfig
    from hone.core.memory.run_plan import Memory, plan_run
    from hone.core.memory.time_estimate import estimate_run_time

    config = RunConfig()
    config.model.name_or_path = "smollm2-135m"  # a benchmark shape: its config is built, no files read
    config = config.with_overrides(
        ["train.max_steps=30", "train.batch_tokens=2048", "data.max_length=512", 'speed.checkpoint="off"', "lora.r=8"]
    )
    plan = plan_run(config, Memory(16 * 2**30, "this computer (system memory)", gpu=False))
    assert plan.settings.cpu and plan.settings.checkpoint == "off" and plan.mean_row_tokens == 256
    # SmolLM2-135M: 30 layers of width 576, MLP 1536, 9 heads and 3 key/value heads of 64, vocabulary 49,152
    attention, mlp = 2 * 576 * 576 + 2 * 576 * 192, 3 * 576 * 1536
    a = 30 * (attention + mlp) + 49152 * 576
    lora = 30 * 8 * ((576 + 576) + 2 * (576 + 192) + (576 + 576) + 3 * (576 + 1536))
    per_token = 4 * a + 3 * 4 * 30 * 9 * 64 * 128 + 6 * lora
    estimate = estimate_run_time(config, plan, 1e11)
    assert estimate.tokens == 30 * 2048
    assert estimate.flops == pytest.approx(30 * 2048 * per_token)
    assert estimate.high_s == pytest.approx(30 * 2048 * per_token / (1e11 * EFFICIENCY_LOW))

    by_epochs = config.with_overrides(["train.max_steps=0", "train.epochs=2.0"])
    assert estimate_run_time(by_epochs, plan, 1e11) is None  # the data's tokens are not known
    assert estimate_run_time(by_epochs, plan, 1e11, tokens_per_epoch=5000).tokens == 10_000


def test_a_reference_computed_once_scores_each_row_once_not_every_step():
    from hone.core.config import RunConfig
    from hone.core.memory.time_estimate import reference_tokens

    dpo = RunConfig().with_overrides(['train.method="dpo"', "train.epochs=3.0"])
    assert reference_tokens(dpo, 30_000, tokens_per_epoch=10_000) == 10_000  # 3 epochs, the reference scored once
    assert reference_tokens(dpo, 4_000, tokens_per_epoch=10_000) == 4_000  # a short run: only the rows it takes
    assert reference_tokens(dpo, 30_000) == 30_000  # the data's tokens unknown: as in every step
    every_step = dpo.with_overrides(["preference.precompute_reference=false"])
    assert reference_tokens(every_step, 30_000, tokens_per_epoch=10_000) == 30_000
    kto = dpo.with_overrides(['train.method="kto"'])
    assert reference_tokens(kto, 30_000, tokens_per_epoch=10_000) == 30_000  # its KL pairs' reference, every step
    assert reference_tokens(RunConfig(), 30_000, tokens_per_epoch=10_000) == 0  # SFT has no reference


def test_a_dpo_runs_estimate_counts_the_reference_forward_once_per_row():
    from hone.core.config import RunConfig
    from hone.core.memory.run_plan import Memory, plan_run
    from hone.core.memory.time_estimate import estimate_run_time

    config = RunConfig()
    config.model.name_or_path = "smollm2-135m"
    config = config.with_overrides(
        ['train.method="dpo"', "train.epochs=3.0", "train.batch_tokens=2048", "data.max_length=512",
         'speed.checkpoint="off"', "lora.r=8"]
    )  # fmt: skip
    plan = plan_run(config, Memory(16 * 2**30, "this computer (system memory)", gpu=False))
    shape, settings = plan.shape, plan.settings
    step = flops_per_token(shape, lora_rank=8, mean_row_tokens=plan.mean_row_tokens)
    forward = flops_per_token(shape, lora_rank=8, mean_row_tokens=plan.mean_row_tokens, reference_forward=True) - step
    assert settings.lora_rank == 8 and settings.checkpoint == "off"
    once = estimate_run_time(config, plan, 1e11, tokens_per_epoch=10_000)
    assert once.flops == pytest.approx(30_000 * step + 10_000 * forward)
    every = estimate_run_time(config.with_overrides(["preference.precompute_reference=false"]), plan, 1e11, 10_000)
    assert every.flops == pytest.approx(30_000 * (step + forward))
