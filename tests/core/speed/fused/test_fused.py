"""apply_kernels / revert_kernels on real (tiny, random-init) transformers models wrapped by real peft adapters."""

from __future__ import annotations

import contextlib
import itertools
import json
import warnings

import pytest
import torch
from peft import LoraConfig, get_peft_model

from hone.core.speed.fused.apply import FAMILIES, apply_kernels, kernels_applied, revert_kernels
from hone.kernels.rms_norm import FusedRMSNorm
from hone.kernels.weight_casts import reuse_weight_casts
from tests.helpers.lora import TARGETS, lora_model

VOCAB = 1024


def _peft_model(shape: str = "tiny-dense", *, layers: int = 2, seed: int = 0, dropout: float = 0.0):
    return lora_model(shape, vocab=VOCAB, layers=layers, seed=seed, dropout=dropout)


def _packed_batches(steps: int, length: int = 24):
    """One packed row per step (the same tokens, so the loss falls): three sequences whose positions restart at 0
    at boundaries that move from step to step."""
    ids = torch.randint(0, VOCAB, (1, length), generator=torch.Generator().manual_seed(123))
    batches = []
    for step in range(steps):
        cuts = [0, 5 + step, length // 2 + 2, length]
        pos = torch.cat([torch.arange(b - a) for a, b in itertools.pairwise(cuts)])[None]
        batches.append((ids, pos))
    return batches


# Every forward passes use_cache=False, as training does: with a cache, transformers ignores the packed
# position ids when building the attention mask, and checkpointing turns the cache off, so the two would
# otherwise attend differently.


def _train(model, batches, seed: int = 0, step_scope=contextlib.nullcontext) -> list[float]:
    torch.manual_seed(seed)
    model.train()
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    losses = []
    for ids, pos in batches:
        with step_scope():
            loss = model(input_ids=ids, position_ids=pos, labels=ids, use_cache=False).loss
            loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses


def _module_ids(model) -> dict[str, int]:
    return {name: id(module) for name, module in model.named_modules()}


@pytest.mark.parametrize(("shape", "norms"), [("tiny-dense", 9), ("tiny-llama", 5)])
def test_apply_replaces_what_the_report_says_and_revert_restores_exactly(shape, norms):
    model = _peft_model(shape)
    before_modules = _module_ids(model)
    before_state = {k: v.clone() for k, v in model.state_dict().items()}
    report = apply_kernels(model)

    layers = 2
    assert report.family == FAMILIES[model.config.model_type] and report.backend == "torch"
    assert report.patched == {
        "rms_norm": norms,
        "add_rms_norm": layers,
        "rope": layers,
        "glu:silu": layers,
        "lora_linear": 7 * layers,
    }, report.summary()
    assert not report.skipped, report.skipped
    decoder = model.get_base_model().model.layers[0]
    assert isinstance(decoder.input_layernorm, FusedRMSNorm)
    assert "forward" in decoder.__dict__ and "forward" in decoder.self_attn.__dict__
    assert "forward" in decoder.mlp.__dict__ and "forward" in decoder.self_attn.q_proj.__dict__
    assert kernels_applied(model) is report and apply_kernels(model) is report  # applying twice is a no-op
    assert list(model.state_dict()) == list(before_state), "state dict keys changed"
    json.dumps(report.to_dict())

    assert revert_kernels(model) == sum(report.patched.values())
    assert _module_ids(model) == before_modules, "revert did not put the original module objects back"
    assert not any("forward" in m.__dict__ for m in model.modules()), "an instance forward was left behind"
    for key, value in model.state_dict().items():
        assert torch.equal(value, before_state[key]), key
    assert kernels_applied(model) is None and revert_kernels(model) == 0


@pytest.mark.parametrize("shape", ["tiny-dense", "tiny-llama"])
def test_training_with_kernels_matches_without(shape):
    """A few AdamW steps on packed rows: same losses with the patched modules (torch path on CPU)."""
    batches = _packed_batches(3)
    plain = _train(_peft_model(shape, dropout=0.1), batches)
    fused_model = _peft_model(shape, dropout=0.1)
    apply_kernels(fused_model)
    fused = _train(fused_model, batches)
    assert plain[-1] < plain[0], "the reference run did not learn; the comparison would be vacuous"
    torch.testing.assert_close(torch.tensor(fused), torch.tensor(plain), atol=1e-5, rtol=1e-5)


def test_weight_casts_reused_within_each_step_train_exactly_like_casting_every_call():
    """A bf16 model with fp32 adapters, as the trainer runs it: each step's forward and backward inside
    `reuse_weight_casts()` (one cast per adapter weight per step) gives the same losses, bit for bit, as casting at
    every call; a cast kept past the optimizer step would train on stale adapters and drift."""
    batches = _packed_batches(4)
    runs = []
    for scope in (contextlib.nullcontext, reuse_weight_casts):
        model = _peft_model("tiny-dense").to(torch.bfloat16)
        for param in model.parameters():
            if param.requires_grad:
                param.data = param.data.float()  # peft's adapters stay fp32 next to a bf16 base
        apply_kernels(model)
        runs.append(_train(model, batches, step_scope=scope))
    assert runs[0][-1] < runs[0][0], "the run did not learn; the comparison would be vacuous"
    assert runs[1] == runs[0]


@pytest.mark.parametrize("shape", ["tiny-dense", "tiny-llama"])
def test_triton_path_trains_like_the_reference(shape, monkeypatch):
    """The same comparison with every kernel running in Triton's interpreter."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    batches = _packed_batches(2, length=16)
    plain = _train(_peft_model(shape, layers=1), batches)
    fused_model = _peft_model(shape, layers=1)
    assert apply_kernels(fused_model).backend == "triton-interpreter"
    fused = _train(fused_model, batches)
    torch.testing.assert_close(torch.tensor(fused), torch.tensor(plain), atol=2e-5, rtol=2e-5)


def test_gradient_checkpointing_recomputes_identically(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    ids, pos = _packed_batches(1, length=16)[0]
    grads = []
    for checkpointing in (False, True):
        model = _peft_model("tiny-dense", layers=1)
        if checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        apply_kernels(model)
        model.train()
        model(input_ids=ids, position_ids=pos, labels=ids, use_cache=False).loss.backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
    assert grads[0].keys() == grads[1].keys() and len(grads[0]) == 14
    for name, grad in grads[0].items():
        torch.testing.assert_close(grads[1][name], grad, atol=1e-6, rtol=1e-6, msg=lambda m, n=name: f"{n}: {m}")


_TINY = dict(
    vocab_size=256,
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
    max_position_embeddings=64,
    tie_word_embeddings=False,
)
_FAMILY_CONFIGS = {
    "llama": {},
    "mistral": {},
    "qwen2": {},
    "qwen3": {},
    "gemma": {"hidden_act": "gelu_pytorch_tanh"},
    "gemma2": {"query_pre_attn_scalar": 8, "sliding_window": 4},
    "gemma3_text": {"query_pre_attn_scalar": 8, "sliding_window": 4},
    "qwen2_moe": {
        "moe_intermediate_size": 16,
        "shared_expert_intermediate_size": 24,
        "num_experts": 4,
        "num_experts_per_tok": 2,
    },
    "qwen3_moe": {"moe_intermediate_size": 16, "num_experts": 4, "num_experts_per_tok": 2},
    "mixtral": {"num_local_experts": 4, "num_experts_per_tok": 2},
}
# Per family: norms per layer (+1 final), whether the decoder is pre-norm (fused add), the GLU activation of
# the dense/shared MLP (None: MoE experts only).
_EXPECTED = {
    "llama": (2, True, "silu"),
    "mistral": (2, True, "silu"),
    "qwen2": (2, True, "silu"),
    "qwen3": (4, True, "silu"),
    "gemma": (2, True, "gelu_tanh"),
    "gemma2": (4, False, "gelu_tanh"),
    "gemma3_text": (6, False, "gelu_tanh"),
    "qwen2_moe": (2, True, "silu"),
    "qwen3_moe": (4, True, None),
    "mixtral": (2, True, None),
}


@pytest.mark.parametrize("model_type", list(_FAMILY_CONFIGS))
def test_every_family_computes_the_same_loss_and_gradients(model_type):
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(model_type, **_TINY, **_FAMILY_CONFIGS[model_type])
    ids, pos = _packed_batches(1, length=12)[0]
    ids = ids % _TINY["vocab_size"]
    results = []
    for fused in (False, True):
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(config)
        with torch.no_grad():  # norms away from their init values so both weight styles matter
            for name, param in model.named_parameters():
                if "norm" in name:
                    param.add_(0.2 * torch.randn_like(param))
        report = _loss_and_grads(model, TARGETS, ids, pos, fused, results)

    norms, prenorm, activation = _EXPECTED[model_type]
    assert report.family == FAMILIES[model_type]
    assert report.count("rms_norm") == 2 * norms + 1 and report.count("rope") == 2, report.summary()
    assert report.count("add_rms_norm") == (2 if prenorm else 0), report.summary()
    assert report.count(f"glu:{activation}") == (2 if activation else 0), report.summary()
    assert report.count("lora_linear") > 0
    _assert_same(results, model_type)


def _loss_and_grads(model, targets, ids, pos, fused: bool, results: list):
    """LoRA on `targets`, kernels applied when `fused`; appends (loss, gradients) of one forward + backward to
    `results` and returns the kernel report (None unfused)."""
    model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=targets))
    for name, param in model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(param, std=0.05)
    report = apply_kernels(model) if fused else None
    loss = model(input_ids=ids, position_ids=pos, labels=ids, use_cache=False).loss
    loss.backward()
    results.append((loss.item(), {n: p.grad for n, p in model.named_parameters() if p.grad is not None}))
    return report


def _assert_same(results: list, what: str) -> None:
    (plain_loss, plain_grads), (fused_loss, fused_grads) = results
    assert abs(fused_loss - plain_loss) < 1e-5, (what, fused_loss, plain_loss)
    assert fused_grads.keys() == plain_grads.keys()
    for name, grad in plain_grads.items():
        torch.testing.assert_close(fused_grads[name], grad, atol=1e-6, rtol=1e-5, msg=lambda m, n=name: f"{n}: {m}")


def test_unsupported_family_gets_lora_only_and_says_why():
    model = _peft_model("tiny-moe-granite", layers=1)
    report = apply_kernels(model)
    assert report.family is None and set(report.patched) == {"lora_linear"}, report.summary()
    assert any("granitemoe" in reason for reason in report.skipped), report.skipped
    assert "granitemoe" in report.summary()
    revert_kernels(model)


def test_revert_leaves_a_later_swap_by_someone_else_alone():
    model = _peft_model("tiny-llama", layers=1)
    report = apply_kernels(model)
    mlp = model.get_base_model().model.layers[0].mlp

    def other(x):
        return x

    mlp.forward = other  # another speed path replaced our swap after us
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        restored = revert_kernels(model)
    assert restored == sum(report.patched.values()) - 1
    assert mlp.forward is other
    assert any("replaced again" in str(w.message) for w in caught)


# MoE families whose decoder layers are pre-norm like Llama's: their norms (MLA's q/kv norms too), residual adds,
# first dense layers and shared experts take the fused kernels; experts stay with the MoE backends, MLA attention
# (no k_proj) keeps transformers' rope.
_MOE_FAMILY_SHAPES = [
    "tiny-moe-glm4",
    "tiny-moe-glm4-lite",
    "tiny-moe-deepseek-v3",
    "tiny-moe-olmoe",
    "tiny-moe-ernie",
    "tiny-moe-minimax-m2",
    "tiny-moe-gptoss",
]
_MLA_TARGETS = ["q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj"]


@pytest.mark.parametrize("shape", _MOE_FAMILY_SHAPES)
def test_moe_families_take_the_dense_kernels_and_train_the_same(shape):
    from hone.core.models.shapes import SHAPES, build_model

    ids, pos = _packed_batches(1, length=12)[0]
    results, glu_mlps = [], 0
    for fused in (False, True):
        model = build_model(shape, seed=0)
        with torch.no_grad():  # norms away from their init values so both weight styles matter
            for name, param in model.named_parameters():
                if "norm" in name:
                    param.add_(0.2 * torch.randn(param.shape, generator=torch.Generator().manual_seed(1)))
        glu_mlps = sum(
            all(hasattr(m, n) for n in ("gate_proj", "up_proj", "down_proj", "act_fn")) for m in model.modules()
        )
        targets = [t for t in [*TARGETS, *_MLA_TARGETS] if any(n.endswith(f".{t}") for n, _ in model.named_modules())]
        torch.manual_seed(0)
        report = _loss_and_grads(model, targets, ids, pos, fused, results)

    layers = SHAPES[shape].kwargs["num_hidden_layers"]
    assert report.family == FAMILIES[SHAPES[shape].model_type], report.summary()
    assert report.count("rms_norm") >= 2 * layers + 1, report.summary()
    assert report.count("add_rms_norm") == layers, report.summary()
    assert report.count("glu:silu") == glu_mlps, report.summary()  # first dense layers and shared experts
    _assert_same(results, shape)
