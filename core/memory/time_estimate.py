"""How long a run takes on this computer's CPU, before it starts: the run's floating-point operations over the rate a
short matrix-multiply probe measures here, given as a range.

    flops_per_token(shape, lora_rank=, mean_row_tokens=, recompute=, reference_forward=)   one trained token's work
    reference_tokens(run_config, tokens, tokens_per_epoch)                                 those the reference scores
    run_tokens(max_steps=, batch_tokens=, grad_accum=, epochs=, tokens_per_epoch=)          the tokens a run trains on
    measure_matmul_rate()                                                                    float32 flop/s, cached
    estimate_time(tokens, per_token, flops_per_s) -> TimeEstimate                           seconds, low and high
    estimate_run_time(run_config, run_plan, flops_per_s, tokens_per_epoch)                  all of it for one run

The count per token (A: the weights a token is multiplied by, L: the LoRA values, attention over the earlier tokens
of its row):

    forward                    2A + attention
    backward                   2A + 2 x attention   the base is frozen: gradients flow to its inputs, and no weight
                                                    gradient is formed (the 6A of full fine-tuning is 4A here)
    LoRA                       6L                   forward, input and weight gradients of the adapter
    activation checkpointing   2A + attention + 2L  each layer's forward again in the backward
    reference model            2A + attention       DPO and KTO score each row with the frozen model too; with
                                                    preference.precompute_reference DPO does it once per row
                                                    before step 1, not in every step (`reference_tokens`)

Plain arithmetic (the probe alone runs torch). The rate a training step reaches is a share of the probe's, because
attention, norms, the optimizer and Python run far below a large matmul's rate: the range spans EFFICIENCY_LOW to
EFFICIENCY_HIGH of it.
"""

from __future__ import annotations

import functools
import os
import time
import typing
from dataclasses import dataclass

from hone.core.config import RunConfig
from hone.core.memory.shape import ModelShape

if typing.TYPE_CHECKING:
    from hone.core.memory.run_plan import RunPlan

# Share of the probe's float32 matmul rate a CPU training step reaches. A LoRA step of a small model spends much of
# its time outside large matmuls (attention over short rows, norms, the LoRA's thin matmuls, the optimizer, Python);
# half the probe's rate is what large models approach, a fifth what small ones on short rows do. Not measured across
# machines: the range is what the Studio promises, no more.
EFFICIENCY_HIGH = 0.5
EFFICIENCY_LOW = 0.2
# The probe multiplies two float32 matrices of this side (2 x 768^3 = 0.9 GFLOP a call: past the BLAS's start-up,
# a few milliseconds on a laptop core) until this many seconds have passed.
PROBE_SIDE = 768
PROBE_SECONDS = 0.25
# Methods that score each row with the frozen model as well (the reference of DPO's and KTO's losses).
REFERENCE_METHODS = ("dpo", "kto")
# Methods whose reference forward preference.precompute_reference takes out of the steps: it runs once per row of
# the data before step 1 instead. KTO computes its rows' reference once too, but keeps the reference forward of its KL
# pairs in every step, which is what the one forward counted for it stands for.
PRECOMPUTED_REFERENCE_METHODS = ("dpo",)


@dataclass(frozen=True)
class TimeEstimate:
    """A run's predicted time on the CPU.

    Attributes:
        tokens: the tokens its steps go through (forward and backward), padding aside.
        flops: floating-point operations of all its steps.
        flops_per_s: the probe's float32 matmul rate on this CPU.
        low_s, high_s: seconds at EFFICIENCY_HIGH and EFFICIENCY_LOW of that rate.
    """

    tokens: int
    flops: float
    flops_per_s: float
    low_s: float
    high_s: float


def active_params(shape: ModelShape) -> int:
    """Weights each token is multiplied by: every layer's attention and MLP (for experts, the `top_k` it is routed to,
    the router and a shared expert) and the LM head (tied to the embedding or not, it multiplies every token; the
    embedding itself is a lookup)."""
    h = shape.hidden
    moe_mlp = shape.top_k * 3 * h * shape.expert_intermediate + h * shape.experts + 3 * h * shape.shared_intermediate
    dense = shape.layers - shape.moe_layers
    return (
        shape.layers * shape.attention_params
        + dense * shape.mlp_params(False)
        + shape.moe_layers * moe_mlp
        + shape.vocab * h
    )


def flops_per_token(
    shape: ModelShape,
    *,
    lora_rank: int,
    mean_row_tokens: float,
    lora_experts: bool = True,
    recompute: bool = False,
    reference_forward: bool = False,
) -> float:
    """Floating-point operations one trained token costs in a LoRA step (the table in the module's docstring).

    Attention: a token's query meets the keys and values of the tokens before it in its row, half the row on average;
    QK^T and the weighted sum of V take 2 flops each per head value per such token, in every layer.
    """
    matmul = 2.0 * active_params(shape)
    attention = 4.0 * shape.layers * shape.heads * shape.head_dim * (mean_row_tokens / 2)
    lora = float(shape.lora_params(lora_rank, lora_experts))
    forward = matmul + attention + 2 * lora
    total = forward + (matmul + 2 * attention) + 4 * lora
    if recompute:
        total += forward
    if reference_forward:
        total += matmul + attention
    return total


def run_tokens(
    *, max_steps: int, batch_tokens: int, grad_accum: int, epochs: float, tokens_per_epoch: int | None = None
) -> int | None:
    """Tokens the run's steps go through: full batches for `max_steps` steps, else `epochs` passes over the data
    (None when the data's tokens are not known)."""
    if max_steps:
        return max_steps * batch_tokens * grad_accum
    if tokens_per_epoch is None:
        return None
    return round(epochs * tokens_per_epoch)


def reference_tokens(config: RunConfig, tokens: int, tokens_per_epoch: int | None = None) -> int:
    """Tokens of a run of `tokens` trained tokens that go through the reference model's forward: none without a
    reference, each row once when it is computed before step 1 (at most an epoch's tokens), else every token."""
    method = config.train.method
    if method not in REFERENCE_METHODS:
        return 0
    if method in PRECOMPUTED_REFERENCE_METHODS and config.preference.precompute_reference and tokens_per_epoch:
        return min(tokens, tokens_per_epoch)
    return tokens


def estimate_time(tokens: int, per_token: float, flops_per_s: float) -> TimeEstimate:
    """The range of seconds `tokens` tokens of `per_token` flops take at a probe rate of `flops_per_s`."""
    if flops_per_s <= 0:
        raise ValueError(f"the CPU's rate must be positive, not {flops_per_s}")
    flops = tokens * per_token
    return TimeEstimate(
        tokens=tokens,
        flops=flops,
        flops_per_s=flops_per_s,
        low_s=flops / (flops_per_s * EFFICIENCY_HIGH),
        high_s=flops / (flops_per_s * EFFICIENCY_LOW),
    )


@functools.cache
def measure_matmul_rate() -> float:
    """This CPU's float32 matmul rate in flop/s, on as many threads as a run takes (one measure per process: the
    answer does not change, and the probe keeps the cores busy for a moment). Meant for a background process."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(max(1, os.cpu_count() or 1))  # a run's process takes every core (the helper leaves one)
    try:
        a = torch.randn(PROBE_SIDE, PROBE_SIDE)
        b = torch.randn(PROBE_SIDE, PROBE_SIDE)
        torch.mm(a, b)  # the first call sets up the BLAS's buffers and threads
        calls, start = 0, time.perf_counter()
        while (elapsed := time.perf_counter() - start) < PROBE_SECONDS or calls < 2:
            torch.mm(a, b)
            calls += 1
        return 2.0 * PROBE_SIDE**3 * calls / elapsed
    finally:
        torch.set_num_threads(threads)


def estimate_run_time(
    config: RunConfig, plan: RunPlan, flops_per_s: float, tokens_per_epoch: int | None = None
) -> TimeEstimate | None:
    """The time of a run (a RunConfig) whose memory plan (a RunPlan on the CPU) is `plan`, at the probe's rate; None
    when it cannot be told: a GRPO run spends most of its time sampling answers, which this count leaves out, and a
    run by epochs needs the data's tokens per epoch."""
    if config.train.method == "grpo":
        return None
    train = config.train
    tokens = run_tokens(
        max_steps=train.max_steps,
        batch_tokens=train.batch_tokens,
        grad_accum=train.grad_accum,
        epochs=train.epochs,
        tokens_per_epoch=tokens_per_epoch,
    )
    if tokens is None:
        return None
    settings = plan.settings
    step, with_reference = (
        flops_per_token(
            plan.shape,
            lora_rank=settings.lora_rank,
            lora_experts=settings.lora_experts,
            mean_row_tokens=plan.mean_row_tokens,
            recompute=settings.checkpoint != "off",
            reference_forward=reference,
        )
        for reference in (False, True)
    )
    scored = reference_tokens(config, tokens, tokens_per_epoch)
    per_token = step + (with_reference - step) * scored / max(tokens, 1)
    return estimate_time(tokens, per_token, flops_per_s)
