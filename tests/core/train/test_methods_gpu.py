"""Every training method on the GPU's speed paths (`pytest -m gpu`): DPO, SimPO, ORPO and KTO give the same losses
and rewards with Hone's paths on (packed varlen attention, fused kernels, chunked loss, offloaded checkpoints, the
MoE backends) as with all of them off, in float32, and on 4-bit (QLoRA) base weights; GRPO samples, scores and trains
there; a bf16 run learns."""

from __future__ import annotations

import json
import random

import pytest
import torch

from hone.core import events
from hone.core.train.trainer import Trainer
from tests.core.conftest import write_rows
from tests.helpers.speed_paths import FAST, PLAIN

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


VOWELS = """
def vowels(completion, prompt, row):
    return sum(c in "aeiou" for c in completion.lower()) / max(1, len(completion))
"""


def _arithmetic(count: int = 24):
    """Prompts with a right answer and a shorter wrong one."""
    rng = random.Random(0)
    out = []
    for _ in range(count):
        a, b = rng.randint(1, 50), rng.randint(1, 50)
        out.append(
            (
                [{"role": "user", "content": f"What is {a} plus {b}?"}],
                [{"role": "assistant", "content": f"{a} plus {b} is {a + b}, counted on my fingers."}],
                [{"role": "assistant", "content": f"{a * b + 3}."}],
            )
        )
    return out


@pytest.fixture(scope="module")
def data_files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("methods")
    pairs = [{"prompt": p, "chosen": c, "rejected": r} for p, c, r in _arithmetic()]
    unpaired = []
    for p, c, r in _arithmetic():
        unpaired += [{"prompt": p, "completion": c, "label": True}, {"prompt": p, "completion": r, "label": False}]
    prompts = [{"prompt": f"What is {a} plus {a + 1}?", "answer": str(2 * a + 1)} for a in range(8)]
    (folder / "rewards.py").write_text(VOWELS)
    return {
        "rewards": folder / "rewards.py",
        "pairs": write_rows(folder / "pairs.jsonl", pairs),
        "unpaired": write_rows(folder / "kto.jsonl", unpaired),
        "prompts": write_rows(folder / "prompts.jsonl", prompts),
    }


def _config(tiny_config, model_dir, data, runs, *overrides):
    return tiny_config(
        model_dir,
        (data, data),
        runs,
        "data.eval=[]",
        "data.eval_fraction=0",
        "train.batch_tokens=1024",
        "train.lr=5e-3",
        "train.warmup_steps=0",
        "train.max_steps=3",
        "preference.beta=0.5",
        *overrides,
    )


def _steps(config) -> list[events.StepMetrics]:
    got = list(Trainer(config, device="cuda").run())
    assert isinstance(got[-1], events.RunFinished), got[-1]
    return [e for e in got if isinstance(e, events.StepMetrics)]


METHODS = [("dpo", "pairs"), ("simpo", "pairs"), ("orpo", "pairs"), ("kto", "unpaired")]


@pytest.mark.parametrize("shape", ["tiny-dense", "tiny-moe-qwen3"])
@pytest.mark.parametrize(("method", "data"), METHODS)
def test_preference_methods_match_the_plain_path_on_the_speed_paths(
    tiny_config, tiny_model_dir, data_files, tmp_path, method, data, shape
):
    def run(name, paths):
        config = _config(
            tiny_config, tiny_model_dir(shape), data_files[data], tmp_path / name,
            f'train.method="{method}"', "model.dtype=float32", *paths,
        )  # fmt: skip
        return _steps(config)

    plain, fast = run("plain", PLAIN), run("fast", FAST)
    assert len(plain) == len(fast) == 3
    for want, got in zip(plain, fast):
        assert got.loss == pytest.approx(want.loss, rel=2e-3, abs=1e-4), (method, shape, want.step)
        if want.reward_margin is not None:
            assert got.reward_margin == pytest.approx(want.reward_margin, rel=5e-3, abs=1e-3), (method, want.step)
        if want.chosen_logps is not None:
            assert got.chosen_logps == pytest.approx(want.chosen_logps, rel=2e-3), (method, want.step)


@pytest.mark.parametrize(("method", "data"), METHODS)
def test_preference_methods_learn_in_bf16_on_the_default_paths(
    tiny_config, tiny_model_dir, data_files, tmp_path, method, data
):
    config = _config(
        tiny_config, tiny_model_dir("tiny-dense"), data_files[data], tmp_path,
        f'train.method="{method}"', "train.max_steps=8",
    )  # fmt: skip
    steps = _steps(config)
    assert all(torch.isfinite(torch.tensor(s.loss)) for s in steps)
    assert steps[-1].loss < steps[0].loss, [s.loss for s in steps]
    if steps[0].reward_margin is not None and steps[-1].reward_margin is not None:
        assert steps[-1].reward_margin > steps[0].reward_margin


@pytest.mark.parametrize("shape", ["tiny-dense", "tiny-moe-qwen3"])
def test_grpo_samples_scores_and_trains_on_the_gpu(tiny_config, tiny_model_dir, data_files, tmp_path, shape):
    rewards = '[{kind = "numeric", column = "answer"}, {kind = "python", function = "vowels"}]'
    config = _config(
        tiny_config, tiny_model_dir(shape), data_files["prompts"], tmp_path,
        "train.method=grpo", "train.lr=2e-2", "grpo.num_generations=4", "grpo.max_completion_length=16",
        f"grpo.rewards={rewards}", f"grpo.reward_file={json.dumps(str(data_files['rewards']))}", "grpo.beta=0.05",
    )  # fmt: skip
    got = list(Trainer(config, device="cuda").run())
    assert isinstance(got[-1], events.RunFinished), got[-1]
    started = next(e for e in got if isinstance(e, events.RunStarted))
    # the static sampler, its decode step captured on the trainer's own model (speed paths on, LoRA applied)
    assert started.speed_paths["sampling"] == "static KV cache, decode step as one CUDA graph"
    sampling_notices = [e.message for e in got if isinstance(e, events.Notice) and e.topic == "sampling"]
    assert not sampling_notices, sampling_notices
    steps = [e for e in got if isinstance(e, events.StepMetrics)]
    assert len(steps) == 3
    for step in steps:
        assert torch.isfinite(torch.tensor(step.loss)) and step.reward_std is not None
        assert 0 < step.completion_length <= 16 and step.kl >= 0
    assert steps[-1].kl > 0  # the adapter moved the policy off the base model


@pytest.mark.parametrize(("method", "data"), [("dpo", "pairs"), ("kto", "unpaired")])
def test_preference_on_qlora_matches_the_plain_path_and_learns(
    tiny_config, tiny_model_dir, data_files, tmp_path, method, data
):
    """4-bit base weights (bitsandbytes nf4): the reference is the same quantized weights with the adapter off, and
    the speed paths (Hone's nf4 dequantize in the fused LoRA linears) score the answers as the plain path does."""
    pytest.importorskip("bitsandbytes")

    def run(name, paths, steps=3):
        config = _config(
            tiny_config, tiny_model_dir("tiny-dense"), data_files[data], tmp_path / name,
            f'train.method="{method}"', "lora.qlora=true", f"train.max_steps={steps}", *paths,
        )  # fmt: skip
        return _steps(config)

    plain, fast = run("plain", PLAIN), run("fast", FAST)
    # step 1: the same nf4 weights, LoRA B zero; bf16 rounding apart, the same log-probabilities
    if plain[0].chosen_logps is not None:
        assert fast[0].chosen_logps == pytest.approx(plain[0].chosen_logps, rel=1e-2), method
    assert fast[0].loss == pytest.approx(plain[0].loss, rel=1e-2, abs=1e-3), method
    learned = run("learned", [], steps=8)
    assert all(torch.isfinite(torch.tensor(s.loss)) for s in learned)
    assert learned[-1].loss < learned[0].loss, [s.loss for s in learned]
