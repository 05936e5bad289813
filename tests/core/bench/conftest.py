"""Fixtures for the benchmark tests: one torch thread (tiny matmuls on a shared CPU run ~10x faster without
thread hand-offs), and a runner double whose failures are chosen by the test."""

from __future__ import annotations

import weakref

import pytest
import torch

from hone.core.bench.measure import StepOutcome


@pytest.fixture(autouse=True)
def one_torch_thread():
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


class DoubleRunner:
    """A runner with the real Runner shape: it holds a tensor like a model would, counts its calls, and raises
    `error` at step number `fail_at` (1-based, warm-up included) while a local tensor is alive in the raising
    frame, as activations are in a forward pass. Weak references to both tell a test whether they were freed."""

    kind = "hone"

    def __init__(
        self,
        name: str = "double",
        *,
        fail_at: int | None = None,
        error: BaseException | None = None,
        losses=(3.0, 2.5, 2.0, 1.5, 1.0, 0.5),
        offload_bytes: int | None = None,
    ):
        self.name, self.fail_at, self.error, self.losses = name, fail_at, error, list(losses)
        self.offload_bytes = offload_bytes
        self.weights = None
        self.weights_ref = self.activations_ref = None
        self.calls = {"setup": 0, "step": 0, "forward_backward": 0, "teardown": 0}

    def setup(self) -> None:
        self.calls["setup"] += 1
        self.weights = torch.ones(256, 256)
        self.weights_ref = weakref.ref(self.weights)

    def step(self) -> StepOutcome:
        self.calls["step"] += 1
        if self.fail_at is not None and self.calls["step"] == self.fail_at:
            activations = self.weights @ self.weights
            self.activations_ref = weakref.ref(activations)
            raise self.error
        loss = self.losses[self.calls["step"] - 1]
        return StepOutcome(loss=loss, grad_norm=10 * loss, offload_bytes=self.offload_bytes)

    def forward_backward(self) -> None:
        self.calls["forward_backward"] += 1

    def teardown(self) -> None:
        self.calls["teardown"] += 1
        self.weights = None

    def describe(self) -> dict:
        return {"speed_paths": {"attention": "double"}, "trainable_params": 7, "active_params": 1000}


@pytest.fixture
def double_runner():
    return DoubleRunner


@pytest.fixture
def stand_in_unsloth(monkeypatch):
    """The stand-in `unsloth` package (tests/helpers/stand_in_unsloth) findable here and in child processes, as an
    installed Unsloth would be."""
    import os
    import sys
    from pathlib import Path

    folder = str(Path(__file__).parents[2] / "helpers" / "stand_in_unsloth")
    monkeypatch.syspath_prepend(folder)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [folder, os.environ.get("PYTHONPATH")])))
    assert "unsloth" not in sys.modules  # this process never imports it: only the peer's child does
    return folder
