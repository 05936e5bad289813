"""GRPO runs through Hone's trainer on the CPU: prompts in, sampled answers scored, the adapter trained, and every
step line of metrics.jsonl carrying reward_mean and reward_std."""

from __future__ import annotations

import json
import math

import pytest
import torch

from hone.core import events
from hone.core.config import RunConfig
from hone.core.data.prompts import load_prompt_data
from hone.core.errors import ConfigError
from hone.core.train.run_dir import read_events
from hone.core.train.trainer import Trainer
from tests.core.conftest import write_rows

pytestmark = pytest.mark.core

REWARD_FILE = """
def vowels(completion, prompt, row):
    # a share that varies between random answers, so every group has a spread to learn from
    if not completion:
        return 0.0
    return sum(c in "aeiou" for c in completion.lower()) / len(completion)
"""


@pytest.fixture(scope="module")
def prompt_files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("grpo")
    rows = [{"prompt": f"What is {a} plus {a + 1}?", "answer": str(2 * a + 1)} for a in range(5)]
    rows += [{"messages": [{"role": "user", "content": "Name a vowel."}], "answer": "a"}]
    rows += [{"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]}]
    (folder / "rewards.py").write_text(REWARD_FILE)
    return write_rows(folder / "prompts.jsonl", rows), folder / "rewards.py"


def _config(tiny_config, tiny_model_dir, prompt_files, runs, *overrides) -> RunConfig:
    prompts, reward_file = prompt_files
    rewards = '[{kind = "python", function = "vowels", weight = 1.0}, {kind = "numeric", column = "answer"}]'
    return tiny_config(
        tiny_model_dir("tiny-dense"),
        (prompts, prompts),
        runs,
        "data.eval=[]",
        "train.method=grpo",
        "train.batch_tokens=512",
        "train.lr=2e-2",
        "train.warmup_steps=0",
        "train.max_steps=2",
        "grpo.num_generations=4",
        "grpo.max_completion_length=6",
        f"grpo.rewards={rewards}",
        f"grpo.reward_file={json.dumps(str(reward_file))}",
        *overrides,
    )


@pytest.mark.parametrize("sampler", ["auto", "static"])
def test_grpo_trains_the_adapter_and_logs_rewards(tiny_config, tiny_model_dir, prompt_files, tmp_path, sampler):
    config = _config(
        tiny_config, tiny_model_dir, prompt_files, tmp_path / "runs", "grpo.beta=0.05", f"grpo.sampler={sampler}"
    )
    trainer = Trainer(config, device="cpu")
    got = list(trainer.run())
    assert isinstance(got[-1], events.RunFinished), got[-1]
    started = next(e for e in got if isinstance(e, events.RunStarted))
    want = "static KV cache" if sampler == "static" else "transformers' generate (auto on a CPU)"
    assert started.speed_paths["sampling"] == want
    report = next(e for e in got if isinstance(e, events.DatasetReport))
    assert report.rows_kept == 6 and sum(report.skipped.values()) == 1  # the row ending on an answer
    steps = [e for e in read_events(got[-1].run_dir) if isinstance(e, events.StepMetrics)]
    assert len(steps) == 2
    lines = [json.loads(x) for x in (tmp_path / "runs").glob("*/metrics.jsonl").__next__().read_text().splitlines()]
    step_lines = [x for x in lines if x.get("event") == "StepMetrics"]
    assert step_lines[-1]["kl"] > 0  # the adapter moved the policy off the base model after step 1
    for line in step_lines:
        assert math.isfinite(line["reward_mean"]) and line["reward_std"] > 0
        assert set(line["rewards"]) == {"vowels", "numeric:answer"}
        assert 0 < line["completion_length"] <= 6 and line["kl"] >= 0 and line["clip_fraction"] == 0
        assert math.isfinite(line["loss"])
        # the step's best- and worst-rewarded answers, for the Monitor to show
        assert 1 <= len(line["samples"]) <= 2 and all(x.startswith("reward ") and " → " in x for x in line["samples"])
        rewards = [float(x.split(" ")[1]) for x in line["samples"]]
        assert rewards == sorted(rewards, reverse=True)
    lora_b = [p for n, p in trainer.model.named_parameters() if "lora_B" in n]
    assert lora_b and any(float(p.detach().abs().sum()) > 0 for p in lora_b)  # LoRA B starts at zero


def test_prompts_are_rendered_with_the_assistant_turn_open(smollm2_tokenizer, prompt_files):
    config = RunConfig().with_overrides([f"data.train=[{json.dumps(str(prompt_files[0]))}]"])
    data = load_prompt_data(config.data, smollm2_tokenizer, group=4, max_completion=6)
    first = data.train[0]
    assert first.text.endswith("<|im_start|>assistant\n") and "What is 0 plus 1?" in first.text
    assert first.columns["answer"] == "1" and first.source.endswith(":1")
    assert data.train.lengths[0] == 4 * (len(first.input_ids) + 6)
    assert smollm2_tokenizer.decode(first.input_ids) == first.text


def test_grpo_needs_a_reward():
    with pytest.raises(ConfigError, match=r"grpo\.rewards names none"):
        RunConfig().with_overrides(["train.method=grpo"])
    with pytest.raises(ConfigError, match=r"grpo.rewards\[0\].pattern"):
        RunConfig().with_overrides(['grpo.rewards=[{kind = "regex", pattern = "(unclosed"}]'])


def test_a_run_with_a_failing_reward_goes_on(tiny_config, tiny_model_dir, prompt_files, tmp_path):
    rewards = '[{kind = "python", function = "vowels"}, {kind = "numeric", column = "solution"}]'
    config = _config(tiny_config, tiny_model_dir, prompt_files, tmp_path / "runs", "train.max_steps=1")
    config = config.with_overrides([f"grpo.rewards={rewards}"])
    torch.manual_seed(0)
    got = list(Trainer(config, device="cpu").run())
    assert isinstance(got[-1], events.RunFinished), got[-1]
    step = next(e for e in got if isinstance(e, events.StepMetrics))
    assert step.reward_mean is None and step.reward_problems  # every sample failed the numeric reward: skipped
    assert "no column 'solution'" in step.reward_problems[0] and "prompts.jsonl:" in step.reward_problems[0]


def _train(config: RunConfig, resume=None) -> list:
    """A run's events on the CPU (resuming the run folder `resume`), checked to have finished."""
    got = list(Trainer(config, device="cpu", resume_dir=resume).run())
    assert isinstance(got[-1], events.RunFinished), got[-1]
    return got


@pytest.mark.parametrize("sampler", ["generate", "static"])
def test_a_resumed_grpo_run_samples_and_trains_exactly_as_the_whole_run(
    tiny_config, tiny_model_dir, prompt_files, tmp_path, sampler
):
    def run(folder, steps, resume=None):
        settings = (f"train.max_steps={steps}", f"grpo.sampler={sampler}")
        return _train(_config(tiny_config, tiny_model_dir, prompt_files, tmp_path / folder, *settings), resume)

    whole = run("whole", 3)
    first = run("part", 2)
    resumed = run("part", 3, resume=first[-1].run_dir)
    want = [(e.loss, e.reward_mean) for e in whole if isinstance(e, events.StepMetrics)][2:]
    got = [(e.loss, e.reward_mean) for e in resumed if isinstance(e, events.StepMetrics)]
    assert len(got) == 1 and got[0] == pytest.approx(want[0], rel=1e-5)


def test_a_sample_line_is_cut_to_its_size_on_one_line():
    from hone.core.train.objectives.grpo import SAMPLE_CHARS, sample_line
    from hone.core.train.rewards import Sample

    line = sample_line(0.5, Sample("word\n" * 1000, "ask\tme " * 500, {}, 1000))
    assert line.startswith("reward 0.5 · ask me ask me") and "\n" not in line and "\t" not in line
    prompt, answer = line.removeprefix("reward 0.5 · ").split(" → ")
    assert len(prompt) == SAMPLE_CHARS // 3 and len(answer) == SAMPLE_CHARS and answer.endswith("…")
    assert sample_line(1.0, Sample("5", "2+3?", {}, 1)) == "reward 1 · 2+3? → 5"


def _steps(got) -> list:
    return [e for e in got if isinstance(e, events.StepMetrics)]


def test_num_iterations_trains_several_steps_on_each_batch_of_answers(
    tiny_config, tiny_model_dir, prompt_files, tmp_path
):
    """grpo.num_iterations = 2: steps 1 and 2 train on the same answers (the same rewards and lengths), the second
    with the ratio to the policy that sampled them away from 1 (clipped where it leaves the range); step 3 samples
    anew; an epoch is twice as many steps."""
    config = _config(
        tiny_config,
        tiny_model_dir,
        prompt_files,
        tmp_path / "runs",
        "train.max_steps=3",
        "train.lr=5e-2",
        "grpo.num_iterations=2",
        "grpo.epsilon=0.01",
    )
    got = list(Trainer(config, device="cpu").run())
    assert isinstance(got[-1], events.RunFinished), got[-1]
    one, two, three = _steps(got)
    assert (two.reward_mean, two.completion_length) == (one.reward_mean, one.completion_length)
    assert two.loss != one.loss  # the same answers, a policy one update on
    assert one.clip_fraction == 0 and two.clip_fraction > 0  # ratio 1 on the sampling step, off it after
    assert (three.reward_mean, three.completion_length) != (one.reward_mean, one.completion_length)

    def epoch_steps(iterations: int) -> int:
        cfg = config.with_overrides(
            ["train.max_steps=0", "train.epochs=1", f"grpo.num_iterations={iterations}", f"output.name=e{iterations}"]
        )
        trainer = Trainer(cfg, device="cpu")
        for event in trainer.run():
            if isinstance(event, events.RunStarted):
                trainer.control.stop()
                return event.total_steps
        raise AssertionError("the run did not start")

    assert epoch_steps(2) == 2 * epoch_steps(1) > 0


def test_a_run_resumed_inside_a_cycle_trains_on_the_answers_it_kept(
    tiny_config, tiny_model_dir, prompt_files, tmp_path
):
    """A checkpoint after step 1 of a two-step cycle holds its answers: the resumed step 2 trains on them, and the
    whole run and the resumed one agree on every step."""

    def run(folder, steps, resume=None):
        settings = (f"train.max_steps={steps}", "grpo.num_iterations=2", "grpo.beta=0.05")
        return _train(_config(tiny_config, tiny_model_dir, prompt_files, tmp_path / folder, *settings), resume)

    whole = run("whole", 3)
    first = run("part", 1)
    resumed = run("part", 3, resume=first[-1].run_dir)
    want = [v for e in _steps(whole)[1:] for v in (e.loss, e.reward_mean, e.kl)]
    got = [v for e in _steps(resumed) for v in (e.loss, e.reward_mean, e.kl)]
    assert len(got) == 6 and got == pytest.approx(want, rel=1e-5)
    assert _steps(resumed)[0].reward_mean == _steps(first)[0].reward_mean  # step 2: step 1's answers, kept


def test_kept_answers_from_a_damaged_checkpoint_are_refused():
    from hone.core.errors import HoneError
    from hone.core.train.objectives.grpo_reuse import KeptAnswers

    kept = KeptAnswers(2)
    with pytest.raises(HoneError, match="GRPO answers cannot be read"):
        kept.from_state({"cycle": 0, "rows": {"3": {"completion_ids": torch.zeros(2, 4), "old": torch.zeros(2, 3)}}})


def test_each_steps_packs_come_as_many_times_as_num_iterations():
    from hone.core.train.step import repeat_steps

    packs = [[0], [1], [2], [3], [4]]
    assert repeat_steps(packs, 2, 1) == packs
    # steps of two packs, each given twice; the short last step takes a pack from the epoch's start
    assert repeat_steps(packs, 2, 2) == [[0], [1], [0], [1], [2], [3], [2], [3], [4], [0], [4], [0]]
    assert repeat_steps(packs, 1, 3) == [p for p in packs for _ in range(3)]
