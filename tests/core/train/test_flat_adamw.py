"""FlatAdamW (`train.optimizer = adamw-bf16`): the same update as torch's AdamW with float32 state, unbiased bf16
moments by stochastic rounding, gradients folded into one buffer, clipping on the device, state round trips, and
a trainer run that checkpoints it."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from hone.core import events
from hone.core.train.checkpoints import latest_checkpoint
from hone.core.train.optim import FlatAdamW
from hone.core.train.trainer import Trainer
from hone.kernels.adamw import adamw_step_, adamw_step_reference, sum_squares


def _params(seed: int = 0) -> list[torch.nn.Parameter]:
    gen = torch.Generator().manual_seed(seed)
    return [
        torch.nn.Parameter(torch.randn(5, 7, generator=gen)),
        torch.nn.Parameter(torch.randn(130, generator=gen)),
        torch.nn.Parameter(torch.randn(3, 1, 2, generator=gen)),
    ]


def _loss(params) -> torch.Tensor:
    return sum((p.square() * (i + 1)).sum() + p.sum() for i, p in enumerate(params))


def test_float32_state_takes_torch_adamw_steps_with_clipping_and_weight_decay():
    ours, theirs = _params(), _params()
    flat = FlatAdamW(ours, lr=1e-2, weight_decay=0.1, state_dtype=torch.float32)
    torch_opt = torch.optim.AdamW(theirs, lr=1e-2, weight_decay=0.1)
    for _ in range(6):
        _loss(ours).backward()
        norm = flat.clip_grad_norm_(1.0)
        flat.step()
        flat.zero_grad()
        _loss(theirs).backward()
        want = torch.nn.utils.clip_grad_norm_(theirs, 1.0)
        torch_opt.step()
        torch_opt.zero_grad()
        torch.testing.assert_close(norm, want, msg="global gradient norm")
        for a, b in zip(ours, theirs, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)


def test_gradients_are_folded_into_the_flat_buffer_and_accumulate():
    params = _params()
    flat = FlatAdamW(params, state_dtype=torch.float32)
    for p, offset in zip(params, flat.offsets, strict=True):
        assert p.data_ptr() == flat.flat_params[offset:].data_ptr(), "parameters are views of the flat buffer"
    _loss(params).backward()
    _loss(params).backward()  # gradient accumulation over two micro-batches
    assert all(p.grad is None for p in params), "each parameter's own gradient is freed once folded in"
    expected = [2 * (2 * (i + 1) * p.detach() + 1) for i, p in enumerate(params)]
    for got, want in zip(flat.grad_views(), expected, strict=True):
        torch.testing.assert_close(got, want)
    flat.zero_grad()
    assert flat.flat_grads.abs().max() == 0


def test_dropping_the_optimizer_frees_its_buffers_while_the_model_lives():
    """The gradient hooks stay on the parameters; they must not keep the optimizer (and its moments) alive."""
    import gc
    import weakref

    params = _params()
    flat = FlatAdamW(params)
    _loss(params).backward()
    flat.step()
    moments = weakref.ref(flat.exp_avg_sq)
    gc.disable()  # freed by reference counting alone, not by a later collection
    try:
        del flat
        assert moments() is None, "the optimizer's buffers outlived it"
    finally:
        gc.enable()
    _loss(params).backward()  # a hook of a dropped optimizer leaves the gradient to autograd
    assert all(p.grad is not None for p in params)


def test_bf16_moments_decay_without_bias_by_stochastic_rounding():
    """v = 1 with zero gradients decays by beta2 = 0.999 a step. Rounded to nearest in bf16 it would never move
    (0.1% is under half a bf16 unit); stochastic rounding keeps the mean on 0.999^n."""
    n, steps = 20_000, 40
    p = torch.zeros(n)
    g = torch.zeros(n, dtype=torch.bfloat16)
    m = torch.zeros(n, dtype=torch.bfloat16)
    v = torch.ones(n, dtype=torch.bfloat16)
    for step in range(1, steps + 1):
        adamw_step_(
            p, g, m, v, torch.ones(1), lr=0.0, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.0, step=step, seed=step
        )
    mean = v.float().mean().item()
    assert mean == pytest.approx(0.999**steps, rel=2e-4), f"mean of v {mean} vs {0.999**steps}"
    nearest = torch.ones(1, dtype=torch.bfloat16)
    for _ in range(steps):
        nearest = (nearest.float() * 0.999).to(torch.bfloat16)
    assert nearest.item() == 1.0, "round-to-nearest would have kept v at 1 (the bias this avoids)"


def test_bf16_state_tracks_float32_adamw():
    ours, theirs = _params(1), _params(1)
    flat = FlatAdamW(ours, lr=1e-2, state_dtype=torch.bfloat16)
    torch_opt = torch.optim.AdamW(theirs, lr=1e-2)
    for _ in range(10):
        for params, opt in ((ours, flat), (theirs, torch_opt)):
            _loss(params).backward()
            opt.step()
            opt.zero_grad()
    for a, b in zip(ours, theirs, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=5e-3)  # 5% of the 0.1 that 10 steps of lr 1e-2 can move


def test_state_dict_round_trip_continues_identically():
    a_params, b_params = _params(2), _params(2)
    a = FlatAdamW(a_params, lr=1e-2, seed=7)
    for _ in range(3):
        _loss(a_params).backward()
        a.step()
        a.zero_grad()
    b = FlatAdamW(b_params, lr=5.0, seed=0)
    with torch.no_grad():
        for src, dst in zip(a_params, b_params, strict=True):
            dst.copy_(src)
    b.load_state_dict(a.state_dict())
    assert b.param_groups[0]["lr"] == 1e-2 and b.step_count == 3
    for params, opt in ((a_params, a), (b_params, b)):
        _loss(params).backward()
        opt.step()
    for x, y in zip(a_params, b_params, strict=True):
        assert torch.equal(x, y)
    with pytest.raises(Exception, match="not FlatAdamW"):
        b.load_state_dict(torch.optim.AdamW(_params(), lr=1.0).state_dict())


@pytest.mark.parametrize("state_dtype", [torch.bfloat16, torch.float32], ids=str)
def test_kernels_under_the_interpreter_match_the_torch_path(monkeypatch, state_dtype):
    gen = torch.Generator().manual_seed(3)
    n = 5000  # three 2048-value programs, the last one partial
    tensors = (
        torch.randn(n, generator=gen),
        torch.randn(n, generator=gen).to(torch.bfloat16),
        (0.1 * torch.randn(n, generator=gen)).to(state_dtype),
        torch.rand(n, generator=gen).to(state_dtype),
    )
    kernel, torch_path = [t.clone() for t in tensors], [t.clone() for t in tensors]
    settings = dict(lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.01)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    adamw_step_(*kernel, torch.tensor([0.5]), **settings, step=3, seed=11)
    squares = sum_squares(tensors[1])
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    adamw_step_reference(*torch_path, torch.tensor([0.5]), **settings, bias1=1 - 0.9**3, bias2=1 - 0.999**3, seed=11)
    for got, want, name in zip(kernel, torch_path, ("param", "grad", "m", "v"), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-7, msg=lambda m, n=name: f"{n}: {m}")
    torch.testing.assert_close(squares, tensors[1].float().square().sum())


def test_trainer_trains_and_checkpoints_with_adamw_bf16(tiny_model_dir, chat_files, tiny_config, tmp_path):
    """A short run: gradient norms come from the flat buffer, and a checkpoint holds the flat optimizer state and
    the LoRA weights (views of one buffer, written as separate tensors)."""
    settings = [
        'train.optimizer="adamw-bf16"',
        "train.max_steps=2",
        "output.checkpoint_every=1",
        "data.max_length=128",
        "train.batch_tokens=128",
        "output.name=run",
    ]
    got = list(Trainer(tiny_config(tiny_model_dir("tiny-dense"), chat_files, tmp_path, *settings), device="cpu").run())
    assert isinstance(got[-1], events.RunFinished), got[-1]
    steps = [e for e in got if isinstance(e, events.StepMetrics)]
    assert len(steps) == 2 and all(s.grad_norm > 0 for s in steps) and steps[1].loss < steps[0].loss * 1.5
    checkpoint = latest_checkpoint(tmp_path / "run")
    state = torch.load(checkpoint / "training_state.pt", weights_only=True)  # tensors and plain values only
    assert state["optimizer"]["flat_adamw"] == 1 and state["optimizer"]["step"] >= 1
    saved = load_file(checkpoint / "trainable.safetensors")
    assert saved and all("lora" in name for name in saved)
