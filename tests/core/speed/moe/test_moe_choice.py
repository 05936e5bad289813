"""Backend choice: forced backends, the environment override, auto on a CPU, errors for people, the probe, and
switching a model's experts implementation reversibly."""

from __future__ import annotations

import pytest
import torch

from hone.core.errors import ConfigError
from hone.core.speed import moe
from hone.core.speed.moe.choice import _probe
from hone.kernels.moe.backends import TorchLoopOps
from hone.kernels.moe.grouped_gemm.launch import interpreting


@pytest.fixture
def qwen3(tiny_moe_cache):
    return tiny_moe_cache("tiny-moe-qwen3")


@pytest.mark.parametrize("backend", ["torch", "grouped_mm", "eager"])
def test_forced_backend_sets_the_experts_implementation(qwen3, backend, monkeypatch):
    monkeypatch.delenv(moe.ENV_VAR, raising=False)
    choice = moe.configure(qwen3, backend, "cpu")
    assert choice.name == backend
    assert "speed.moe_backend" in choice.reason
    assert moe.current_implementation(qwen3) == moe.IMPLEMENTATIONS[backend]


def test_environment_variable_overrides_the_config(qwen3, monkeypatch):
    monkeypatch.setenv(moe.ENV_VAR, "torch")
    choice = moe.configure(qwen3, "grouped_mm", "cpu")
    assert choice.name == "torch" and "HONE_MOE_BACKEND=torch" in choice.reason
    assert moe.current_implementation(qwen3) == "hone_torch"


def test_auto_on_cpu_is_the_torch_loop(qwen3, monkeypatch):
    monkeypatch.delenv(moe.ENV_VAR, raising=False)
    choice = moe.configure(qwen3, "auto")
    assert choice == moe.Choice("torch", choice.reason) and "cpu" in choice.reason


def test_unknown_backend_names_the_field(qwen3, monkeypatch):
    monkeypatch.delenv(moe.ENV_VAR, raising=False)
    with pytest.raises(ConfigError, match=r"speed\.moe_backend is 'fast'"):
        moe.configure(qwen3, "fast")
    monkeypatch.setenv(moe.ENV_VAR, "cutlass")
    with pytest.raises(ConfigError, match="HONE_MOE_BACKEND is 'cutlass'") as info:
        moe.configure(qwen3, "auto")
    assert "grouped_mm" in info.value.advice


def test_triton_on_cpu_without_the_interpreter_is_refused(qwen3, monkeypatch):
    if interpreting():
        pytest.skip("the interpreter does run the Triton kernels on the CPU")
    monkeypatch.delenv(moe.ENV_VAR, raising=False)
    with pytest.raises(ConfigError, match="Triton kernels cannot run on cpu"):
        moe.configure(qwen3, "triton", "cpu")


def test_dense_model_is_left_alone(monkeypatch):
    from hone.core.models.shapes import build_model

    monkeypatch.delenv(moe.ENV_VAR, raising=False)
    model = build_model("tiny-dense", layers=1)
    assert moe.configure(model, "grouped_mm").name == "none"


def test_revert_backend_restores_the_previous_implementation(qwen3, monkeypatch):
    monkeypatch.delenv(moe.ENV_VAR, raising=False)
    before = moe.current_implementation(qwen3)
    moe.configure(qwen3, "torch")
    moe.configure(qwen3, "grouped_mm")
    assert moe.current_implementation(qwen3) == "hone_grouped_mm"
    moe.revert_backend(qwen3)
    assert moe.current_implementation(qwen3) == before
    ids = torch.randint(0, 100, (1, 8))
    assert torch.isfinite(qwen3(input_ids=ids).logits).all()


def test_probe_passes_working_backends_and_reports_a_wrong_one():
    device = torch.device("cpu")
    assert moe.probe("torch", device, torch.float32) is None
    assert moe.probe("grouped_mm", device, torch.bfloat16) is None

    class WrongWgrad(TorchLoopOps):
        def wgrad(self, p, q, routing, **kwargs):
            return super().wgrad(p, q, routing, **kwargs) * 1.5

    failure = _probe(WrongWgrad(), device, torch.float32)
    assert failure is not None and "weight gradient off by" in failure
