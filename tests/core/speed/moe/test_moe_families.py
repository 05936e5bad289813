"""Every MoE family transformers ships that `hone.core.speed.moe.families` names, as a tiny random-init model:

- one training step through a Hone CPU experts backend (grouped_mm or torch, in turn) with split expert LoRA gives
  the loss and every LoRA gradient of transformers' eager experts with peft's own LoRA;
- the adapter saved by peft loads back into a fresh model with plain peft and gives the same logits;
- packed rows equal the rows run one by one (Qwen3-Next's Gated DeltaNet layers included: Hone convolves each
  sequence on its own and runs the torch delta rule a sequence at a time);
- the family report names the family, Hone's experts path, the router that runs and the attention path.
"""

from __future__ import annotations

import pytest
import torch

from hone.core.config import LoraConfig, SpeedConfig
from hone.core.data.collate import collate_packed
from hone.core.models.load import count_params, info_from_config
from hone.core.models.shapes import build_model
from hone.core.speed import moe
from hone.core.speed.attention import choice as attention
from hone.core.speed.moe import families as moe_families
from hone.core.speed.moe import family_report as families
from hone.core.train.lora import apply_lora
from hone.core.train.loss import loss_sum
from tests.helpers.packed import per_sequence_loss, random_rows

FAMILY_SHAPES = {
    "tiny-moe-mixtral": "mixtral",
    "tiny-moe-olmoe": "olmoe",
    "tiny-moe-granite": "granitemoe",
    "tiny-moe-minimax-m2": "minimax_m2",
    "tiny-moe-ernie": "ernie4_5_moe",
    "tiny-moe-glm4": "glm4_moe",
    "tiny-moe-glm4-lite": "glm4_moe_lite",
    "tiny-moe-deepseek-v3": "deepseek_v3",
    "tiny-moe-lfm2": "lfm2_moe",
    "tiny-moe-qwen3-next": "qwen3_next",
    "tiny-moe-deepseek-v32": "deepseek_v32",
}
# A small vocabulary: the embedding and head of the shapes' 49,152 tokens would be most of each step's work here.
VOCAB = 2048


def _build(shape: str):
    return build_model(shape, vocab_size=VOCAB)


SIGMOID_ROUTED = {
    "tiny-moe-glm4",
    "tiny-moe-glm4-lite",
    "tiny-moe-deepseek-v3",
    "tiny-moe-deepseek-v32",
    "tiny-moe-minimax-m2",
    "tiny-moe-lfm2",
}


def _peft_model(shape: str, backend: str):
    """Hone's LoRA (every decoder linear layer and the experts) on a fresh model; `eager` puts peft's own expert
    wrappers and transformers' eager experts back, which is the reference."""
    model = _build(shape)
    info = info_from_config(model.config, shape, "shape", count_params(model))
    assert info.is_moe
    if backend != "eager":
        assert moe.configure(model, backend, "cpu").name == backend
    torch.manual_seed(1)
    peft_model, report = apply_lora(model, LoraConfig(r=4, alpha=8), info)
    assert report.target_parameters, "the experts get LoRA"
    if backend == "eager":
        moe.revert_split_lora(peft_model)
        moe.apply_backend(peft_model, "eager")
    generator = torch.Generator().manual_seed(2)
    with torch.no_grad():  # peft starts B at zero; a nonzero B makes every LoRA path show in the gradients
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=generator) * 0.1)
    return peft_model


def _loss_and_grads(peft_model):
    ids = torch.randint(0, 2000, (2, 12), generator=torch.Generator().manual_seed(3))
    loss = peft_model(input_ids=ids, labels=ids).loss
    loss.backward()
    return loss.item(), {n: p.grad.clone() for n, p in peft_model.named_parameters() if p.grad is not None}


# Each family through one of the CPU backends, the two taking turns: the backends' code is shared by every family
# (tests/core/speed/moe/test_moe_training.py runs both on each of the first three), what differs here is the family.
STEP_CASES = [(shape, ("grouped_mm", "torch")[i % 2]) for i, shape in enumerate(FAMILY_SHAPES)]


@pytest.mark.parametrize(("shape", "backend"), STEP_CASES)
def test_a_step_through_a_backend_equals_eager_experts_with_peft(shape, backend, tmp_path):
    from peft import PeftModel

    reference = _peft_model(shape, "eager")
    want_loss, want = _loss_and_grads(reference)
    assert any(".experts." in n for n in want), sorted(want)
    got_loss, got = _loss_and_grads(_peft_model(shape, backend))
    assert got_loss == pytest.approx(want_loss, rel=1e-5), f"{shape} on {backend}"
    assert got.keys() == want.keys()
    for name, grad in got.items():
        torch.testing.assert_close(grad, want[name], rtol=1e-4, atol=1e-6, msg=f"{shape} on {backend}: {name}")

    reference.save_pretrained(tmp_path)  # peft's own format: target_parameters for the experts
    ids = torch.randint(0, 2000, (1, 9), generator=torch.Generator().manual_seed(4))
    reloaded = PeftModel.from_pretrained(_build(shape), tmp_path).eval()
    with torch.no_grad():
        torch.testing.assert_close(reloaded(input_ids=ids).logits, reference.eval()(input_ids=ids).logits)


@pytest.mark.parametrize("shape", list(FAMILY_SHAPES))
def test_packed_rows_stay_apart(shape):
    model = _build(shape)
    rows = random_rows([7, 13, 5], vocab=VOCAB, seed=3)
    assert attention.packing_blocker(model) is None
    assert families.describe(model).packing_blocker is None
    want = per_sequence_loss(model, rows).item()
    attention.configure(model, SpeedConfig(), "cpu")
    got = loss_sum(model, collate_packed(rows)).item()
    assert got == pytest.approx(want, rel=1e-5), f"{shape}: packed {got} vs one by one {want}"


@pytest.mark.parametrize("shape", list(FAMILY_SHAPES))
def test_the_family_report_says_what_runs_where(shape):
    model = _build(shape)
    report = families.describe(model)
    assert report.model_type == FAMILY_SHAPES[shape]
    assert report.family is moe_families.FAMILIES[report.model_type]
    lines = report.lines()
    assert lines[0].startswith(report.family.name)
    assert "Hone's grouped GEMMs" in report.experts
    if shape in SIGMOID_ROUTED:
        assert report.router.startswith("transformers'"), report.router  # not the softmax the fused router runs
    if shape in ("tiny-moe-glm4-lite", "tiny-moe-deepseek-v3", "tiny-moe-deepseek-v32"):
        assert "MLA" in report.attention
    if shape in ("tiny-moe-glm4", "tiny-moe-deepseek-v3", "tiny-moe-deepseek-v32", "tiny-moe-ernie", "tiny-moe-lfm2"):
        assert "first 1 layer dense" in report.shared, report.shared
    assert any(line.startswith("GGUF export: not for MoE models yet") for line in lines)


def test_the_fused_router_is_reported_where_its_check_passes():
    assert families.describe(build_model("tiny-moe-qwen3")).router.startswith("Hone's fused router")
    assert families.describe(build_model("tiny-dense")) is None


def test_qwen3_next_trains_packed_and_its_family_is_on_the_first_lines(
    tiny_model_dir, chat_files, tiny_config, tmp_path
):
    """The trainer on a tiny Qwen3-Next without flash-linear-attention: rows packed, the first lines say how its
    Gated DeltaNet layers keep them apart, the family row is there, and the run finishes."""
    from hone.core import events
    from hone.core.train.trainer import Trainer

    config = tiny_config(
        tiny_model_dir("tiny-moe-qwen3-next"), chat_files, tmp_path, "train.max_steps=1", "speed.moe_backend=torch"
    )
    seen = list(Trainer(config, device="cpu").run())
    assert isinstance(seen[-1], events.RunFinished), seen[-1]
    assert not [e for e in seen if isinstance(e, events.Notice) and e.topic == "packing"]
    started = next(e for e in seen if isinstance(e, events.RunStarted))
    assert "Gated DeltaNet layers: the convolution per packed sequence" in started.speed_paths["attention"]
    assert "one sequence at a time" in started.speed_paths["attention"], started.speed_paths
    assert started.speed_paths["moe family"].startswith("Qwen3-Next (qwen3_next)"), started.speed_paths


def test_deepseek_v32_trains_packed_on_transformers_attention(tiny_model_dir, chat_files, tiny_config, tmp_path):
    """DeepSeek-V3.2's indexer reads the 4-D mask transformers builds: the run keeps transformers' attention (which
    keeps packed rows apart, test above), says why, and finishes instead of failing in the first forward."""
    from hone.core import events
    from hone.core.train.trainer import Trainer

    config = tiny_config(
        tiny_model_dir("tiny-moe-deepseek-v32"), chat_files, tmp_path, "train.max_steps=2", "speed.moe_backend=torch"
    )
    seen = list(Trainer(config, device="cpu").run())
    assert isinstance(seen[-1], events.RunFinished), seen[-1]
    started = next(e for e in seen if isinstance(e, events.RunStarted))
    assert started.speed_paths["attention"].startswith("hf: transformers' attention: its sparse-attention indexer")
    assert started.speed_paths["moe family"].startswith("DeepSeek-V3.2 (deepseek_v32)"), started.speed_paths


def test_latent_attention_is_planned_and_probed_at_its_query_key_head_dim():
    """MLA's `head_dim` is only its rotary part: the planner, the checkpoint policy and the varlen probe use
    qk_nope + qk_rope (24 here), and the probe gets v's own head dim (16)."""
    from hone.core.memory.shape import ModelShape
    from hone.core.models.shapes import make_config

    config = make_config("tiny-moe-deepseek-v3")
    assert config.head_dim == 8 and ModelShape.from_config(config).head_dim == 24
    model = _build("tiny-moe-deepseek-v3")
    assert attention._attention_shape(model)[2] == 24 and attention._value_dim(model) == 16
    assert attention._value_dim(_build("tiny-moe-glm4")) is None
