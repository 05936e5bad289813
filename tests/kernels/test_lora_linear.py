"""The fused LoRA linear against peft's own `lora.Linear` / `lora.Linear4bit`: values and gradients."""

from __future__ import annotations

import copy

import pytest
import torch
from peft import LoraConfig, get_peft_model
from torch.utils._python_dispatch import TorchDispatchMode

from hone.core.speed.fused.lora_layers import lora_base_kind, patch_lora_layer
from hone.kernels.lora_linear import lora_linear
from hone.kernels.reference import lora_linear_reference
from hone.kernels.weight_casts import reuse_weight_casts

TOL = {torch.float32: dict(atol=1e-5, rtol=1e-5), torch.bfloat16: dict(atol=3e-2, rtol=2e-2)}


def _assert_close(got, want, dtype, what):
    """fp32: tight. bf16: peft runs the LoRA branch in fp32 when the adapters are fp32, the fused path in bf16, so
    sums over tokens (the weight gradients) may cancel to small values: the absolute tolerance scales with the
    tensor's largest entry."""
    tol = dict(TOL[dtype])
    if dtype == torch.bfloat16:
        tol["atol"] = max(tol["atol"], 2e-2 * want.abs().max().item())
    torch.testing.assert_close(got, want, **tol, msg=lambda m: f"{what}: {m}")


class _Tiny(torch.nn.Module):
    def __init__(self, k: int, n: int, bias: bool):
        super().__init__()
        self.proj = torch.nn.Linear(k, n, bias=bias)

    def forward(self, x):
        return self.proj(x)


def _peft_layer(k=37, n=19, *, bias=True, dropout=0.0, rslora=False, dtype=torch.float32, seed=0):
    torch.manual_seed(seed)
    model = _Tiny(k, n, bias).to(dtype)
    model = get_peft_model(
        model, LoraConfig(r=4, lora_alpha=12, lora_dropout=dropout, use_rslora=rslora, target_modules=["proj"])
    )
    layer = model.base_model.model.proj
    torch.nn.init.normal_(layer.lora_B["default"].weight, std=0.1)  # peft starts B at zero; make it count
    return model, layer


def _run(layer, x, dout, seed):
    torch.manual_seed(seed)  # the same dropout mask for both paths
    out = layer(x)
    params = [layer.lora_A["default"].weight, layer.lora_B["default"].weight]
    grads = torch.autograd.grad(out, [x, *params], dout)
    return out.detach(), *grads


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("dropout", "rslora", "bias"), [(0.0, False, True), (0.3, False, False), (0.1, True, True)])
def test_fused_lora_matches_peft(dtype, dropout, rslora, bias):
    model, layer = _peft_layer(bias=bias, dropout=dropout, rslora=rslora, dtype=dtype)
    model.train()
    reference_layer = copy.deepcopy(layer)
    assert lora_base_kind(layer) == ("lora_linear", "")
    undo = patch_lora_layer(layer, "proj")
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 5, 37, generator=g).to(dtype).requires_grad_()
    dout = torch.randn(2, 5, 19, generator=g).to(dtype)
    got = _run(layer, x, dout, seed=7)
    want = _run(reference_layer, x, dout, seed=7)
    for a, b, name in zip(got, want, ("out", "dx", "dA", "dB"), strict=True):
        assert a.dtype == b.dtype, name
        _assert_close(a, b, dtype, f"{name} {dtype} dropout={dropout}")
    assert undo() and "forward" not in layer.__dict__


def test_backward_keeps_only_the_input_and_the_rank_sized_product():
    """Nothing of the output's size is saved: the LoRA input, `A x` (tokens x r) and the weights (or their casts to
    the compute dtype, `scaling * B` among them)."""
    _, layer = _peft_layer(k=64, n=48)
    patch_lora_layer(layer, "proj")
    x = torch.randn(10, 64, requires_grad=True)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        layer(x)
    weights = {p.data_ptr() for p in layer.parameters()}
    weight_shapes = {tuple(p.shape) for p in layer.parameters()}
    activations = [t for t in saved if t.data_ptr() not in weights and tuple(t.shape) not in weight_shapes]
    shapes = [tuple(t.shape) for t in activations]
    assert len(activations) == 2 and activations[0].data_ptr() == x.data_ptr(), shapes
    assert shapes[1] == (10, 4), shapes  # A x: tokens x rank


def test_peft_states_that_are_not_the_plain_case_use_peft_forward():
    model, layer = _peft_layer()
    patch_lora_layer(layer, "proj")
    x = torch.randn(3, 37)
    with torch.no_grad():
        base = torch.nn.functional.linear(x, layer.base_layer.weight, layer.base_layer.bias)
        with model.disable_adapter():
            torch.testing.assert_close(layer(x), base)
        lora = lora_linear_reference(
            x,
            layer.base_layer.weight,
            layer.base_layer.bias,
            layer.lora_A["default"].weight,
            layer.lora_B["default"].weight,
            layer.scaling["default"],
        )
        torch.testing.assert_close(layer(x), lora)
        layer.merge()
        torch.testing.assert_close(layer(x), lora, atol=1e-5, rtol=1e-5)
        layer.unmerge()
        torch.testing.assert_close(layer(x), lora)


def test_lora_linear_refuses_ambiguous_base():
    x, a, b = torch.randn(2, 4), torch.randn(1, 4), torch.randn(3, 1)
    with pytest.raises(ValueError, match="exactly one"):
        lora_linear(x, a, b, 1.0)
    with pytest.raises(ValueError, match="frozen"):
        lora_linear(x, a, b, 1.0, weight=torch.randn(3, 4, requires_grad=True))


def test_qlora_layer_matches_peft_linear4bit(monkeypatch):
    """peft's Linear4bit over a bitsandbytes nf4 base (CPU backend) against the fused path with our dequantize."""
    bnb = pytest.importorskip("bitsandbytes")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    torch.manual_seed(0)

    class Quantized(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = bnb.nn.Linear4bit(
                128, 24, bias=False, compute_dtype=torch.float32, quant_type="nf4", compress_statistics=True
            )
            self.proj.weight = bnb.nn.Params4bit(
                0.05 * torch.randn(24, 128), requires_grad=False, quant_type="nf4", compress_statistics=True
            )

        def forward(self, x):
            return self.proj(x)

    model = get_peft_model(Quantized().to("cpu"), LoraConfig(r=4, lora_alpha=8, target_modules=["proj"]))
    layer = model.base_model.model.proj
    torch.nn.init.normal_(layer.lora_B["default"].weight, std=0.1)
    assert lora_base_kind(layer) == ("qlora_linear", "")
    x = torch.randn(6, 128, requires_grad=True)
    dout = torch.randn(6, 24)
    want = _run(layer, x, dout, seed=0)
    patch_lora_layer(layer, "proj")
    got = _run(layer, x, dout, seed=0)
    for a, b, name in zip(got, want, ("out", "dx", "dA", "dB"), strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5, msg=lambda m, n=name: f"qlora {n}: {m}")


class _WeightCasts(TorchDispatchMode):
    """Counts the ops that cast or scale an fp32 tensor of one of the given shapes (the adapters' weights, not their
    gradients, which arrive in bf16)."""

    def __init__(self, shapes: set[tuple[int, ...]]):
        super().__init__()
        self.shapes, self.count = shapes, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        source = args[0]
        if (
            func in (torch.ops.aten._to_copy.default, torch.ops.aten.mul.out)
            and source.dtype == torch.float32
            and tuple(source.shape) in self.shapes
        ):
            self.count += 1
        return func(*args, **(kwargs or {}))


def _casts_in(layer, fn) -> int:
    with _WeightCasts({tuple(p.shape) for p in layer.parameters() if p.requires_grad}) as mode:
        fn()
    return mode.count


def test_adapter_casts_are_made_once_inside_a_step_and_afresh_after_it():
    """fp32 adapters on a bf16 layer: A and `scaling * B` are cast once per call (backward reuses them), once per
    `reuse_weight_casts` block however many calls it holds, and a weight changed after the block is cast again."""
    _, layer = _peft_layer(dtype=torch.bfloat16)
    patch_lora_layer(layer, "proj")
    a, b = layer.lora_A["default"].weight, layer.lora_B["default"].weight
    assert a.dtype == torch.float32, "peft keeps the adapters in fp32 next to a bf16 base"
    x = torch.randn(6, 37, dtype=torch.bfloat16, requires_grad=True)

    def step():
        layer(x).float().sum().backward()

    assert _casts_in(layer, step) == 2
    want = layer(x).detach()
    with reuse_weight_casts():
        assert _casts_in(layer, step) == 2
        assert _casts_in(layer, step) == 0, "the second call inside the block reused the first one's casts"
        assert torch.equal(layer(x).detach(), want)

    with torch.no_grad():
        a.add_(0.5)
    with reuse_weight_casts():
        got = layer(x).detach()
    reference = lora_linear_reference(
        x.detach(),
        layer.base_layer.weight,
        layer.base_layer.bias,
        a.to(x.dtype),
        b.to(x.dtype),
        layer.scaling["default"],
    )
    _assert_close(got, reference, torch.bfloat16, "after the adapter changed")
    assert not torch.equal(got, want)


def test_without_grad_the_lora_linear_runs_without_an_autograd_node_and_gives_the_same_values():
    _, layer = _peft_layer(dtype=torch.bfloat16)
    patch_lora_layer(layer, "proj")
    x = torch.randn(2, 6, 37, dtype=torch.bfloat16, requires_grad=True)
    with torch.no_grad():
        direct = layer(x)
    assert direct.grad_fn is None
    assert torch.equal(direct, layer(x).detach())


def test_a_layer_follows_adapter_changes_made_between_its_calls():
    """The fused forward keeps what it read from the layer between calls: switching, adding, disabling, merging
    adapters and train/eval mode must each still be seen at the next call."""
    model, layer = _peft_layer(dropout=0.5)
    patch_lora_layer(layer, "proj")
    x = torch.randn(3, 37)
    weight, bias = layer.base_layer.weight, layer.base_layer.bias

    def expected(name):
        return lora_linear_reference(
            x, weight, bias, layer.lora_A[name].weight, layer.lora_B[name].weight, layer.scaling[name]
        )

    model.eval()
    with torch.no_grad():
        torch.testing.assert_close(layer(x), expected("default"))  # plan made in eval mode: no dropout
        model.add_adapter("second", LoraConfig(r=2, lora_alpha=4, target_modules=["proj"]))
        torch.nn.init.normal_(layer.lora_B["second"].weight, std=0.1)
        model.set_adapter("second")
        model.eval()
        torch.testing.assert_close(layer(x), expected("second"))
        model.set_adapter("default")
        model.eval()
        torch.testing.assert_close(layer(x), expected("default"))
        with model.disable_adapter():
            torch.testing.assert_close(layer(x), torch.nn.functional.linear(x, weight, bias))
        torch.testing.assert_close(layer(x), expected("default"))
    model.train()
    with torch.no_grad():
        assert not torch.allclose(layer(x), expected("default")), "training mode: dropout (p = 0.5) applies again"
