"""train.sample_prompts on a tiny random-init model (CPU): answers at each evaluation in samples.jsonl, equal to what
the saved adapter answers when loaded anew with plain transformers + peft; training bit-exact with and without them;
a resume drops the lines of the steps it trains again."""

from __future__ import annotations

import json
import shutil

import pytest

from hone.core import events
from hone.core.config import RunConfig
from hone.core.errors import ConfigError
from hone.core.train.samples_file import SAMPLES_FILE, read_samples
from hone.core.train.trainer import Trainer

PROMPTS = ["What is 2 + 2?", "Name a colour."]
SETTINGS = ("train.max_steps=4", "train.eval_every=2", "lora.dropout=0.1", "train.lr=2e-2")


def _losses(got: list) -> tuple[list[float], list[float]]:
    return (
        [e.loss for e in got if isinstance(e, events.StepMetrics)],
        [e.loss for e in got if isinstance(e, events.EvalMetrics)],
    )


def _greedy(model_dir, adapter_dir, prompt_ids: list[int], max_new_tokens: int) -> list[int]:
    """The answer tokens of the base model with the adapter, loaded from disk, plain transformers `generate`."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model = PeftModel.from_pretrained(base, adapter_dir).eval()
    ids = torch.tensor([prompt_ids])
    with torch.no_grad():
        out = model.generate(
            input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=max_new_tokens
        )
    return out[0, ids.shape[1] :].tolist()


def test_samples_leave_training_bit_exact_and_match_the_saved_adapter(
    tiny_model_dir, chat_files, tiny_config, tmp_path, smollm2_tokenizer
):
    model_dir = tiny_model_dir("tiny-dense")
    plain = list(
        Trainer(tiny_config(model_dir, chat_files, tmp_path, *SETTINGS, "output.name=plain"), device="cpu").run()
    )
    sampled_config = tiny_config(
        model_dir,
        chat_files,
        tmp_path,
        *SETTINGS,
        "output.name=sampled",
        f"train.sample_prompts={json.dumps(PROMPTS)}",
        "train.sample_max_new_tokens=6",
    )
    sampled = list(Trainer(sampled_config, device="cpu").run())
    assert isinstance(sampled[-1], events.RunFinished), sampled[-1]
    assert _losses(sampled) == _losses(plain)  # exactly: answering changed nothing the run trains
    assert len(_losses(plain)[1]) == 2

    run_dir = tmp_path / "sampled"
    steps = read_samples(run_dir)
    assert [s.step for s in steps] == [2, 4]
    assert all([p for p, _ in s.samples] == PROMPTS for s in steps)
    assert not (tmp_path / "plain" / SAMPLES_FILE).exists()
    # The last evaluation's answers are the final adapter's, reloaded from disk by plain transformers + peft.
    for prompt, (_, answer) in zip(PROMPTS, steps[-1].samples, strict=True):
        rendered = smollm2_tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True
        )
        ids = smollm2_tokenizer(rendered, add_special_tokens=False)["input_ids"]
        expected = _greedy(model_dir, run_dir / "adapter", ids, 6)
        assert answer == smollm2_tokenizer.decode(expected, skip_special_tokens=True).strip()


def test_sample_prompts_n_answers_the_first_evaluation_rows(tiny_model_dir, chat_files, tiny_config, tmp_path):
    config = tiny_config(
        tiny_model_dir("tiny-dense"),
        chat_files,
        tmp_path,
        "train.max_steps=1",
        "train.sample_prompts=3",
        "train.sample_max_new_tokens=4",
        "output.name=rows",
    )
    got = list(Trainer(config, device="cpu").run())
    assert isinstance(got[-1], events.RunFinished), got[-1]
    (step,) = read_samples(tmp_path / "rows")
    rows = [json.loads(line) for line in chat_files[1].read_text().splitlines()][:3]
    # Each eval row's prompt is its system and user turns: shown whole (no template tokens), the user's words in it.
    assert step.step == 1 and len(step.samples) == 3
    for row, (prompt, answer) in zip(rows, step.samples, strict=True):
        user = row["messages"][1]["content"]
        assert user in prompt and "<|im_start|>" not in prompt and row["messages"][2]["content"] not in prompt
        assert isinstance(answer, str)


def test_resume_drops_the_samples_of_steps_trained_again(tiny_model_dir, chat_files, tiny_config, tmp_path):
    settings = [
        "train.max_steps=4",
        "train.eval_every=1",
        "output.checkpoint_every=2",
        "output.keep_checkpoints=3",
        f"train.sample_prompts={json.dumps(PROMPTS[:1])}",
        "train.sample_max_new_tokens=4",
        "output.name=resumed",
    ]
    config = tiny_config(tiny_model_dir("tiny-dense"), chat_files, tmp_path, *settings)
    assert isinstance(list(Trainer(config, device="cpu").run())[-1], events.RunFinished)
    run_dir = tmp_path / "resumed"
    first = read_samples(run_dir)
    assert [s.step for s in first] == [1, 2, 3, 4]
    shutil.rmtree(run_dir / "checkpoints" / "step-000004")  # the resume goes on from step 2
    path = run_dir / SAMPLES_FILE
    lines = path.read_text().splitlines(keepends=True)
    stale = json.dumps({"step": 3, "samples": [{"prompt": PROMPTS[0], "answer": "stale"}]}) + "\n"
    path.write_text("".join(lines[:3]) + stale + lines[3] + '{"step": 4, "samples": [{"pro')  # a kill's cut line
    got = list(Trainer(config, resume_dir=run_dir, device="cpu").run())
    assert isinstance(got[-1], events.RunFinished), got[-1]
    written = [json.loads(line) for line in path.read_text().splitlines()]
    assert [w["step"] for w in written] == [1, 2, 3, 4]  # each once: 3 and 4 dropped, then written again
    assert "stale" not in path.read_text()
    assert read_samples(run_dir) == first  # the same weights at each step: the same answers


def test_sample_prompts_setting_is_checked():
    assert RunConfig().with_overrides(['train.sample_prompts="5"', "data.eval_fraction=0.1"]).train.sample_prompts == 5
    assert RunConfig().with_overrides(["train.sample_prompts=Hello there"]).train.sample_prompts == ["Hello there"]
    with pytest.raises(ConfigError, match=r"train.sample_prompts = 2 answers the first evaluation rows"):
        RunConfig().with_overrides(["train.sample_prompts=2"])
    with pytest.raises(ConfigError, match=r"train.sample_prompts is 65, not between 0 and 64"):
        RunConfig().with_overrides(["train.sample_prompts=65", "data.eval_fraction=0.1"])
    with pytest.raises(ConfigError, match=r"train.sample_prompts\[1\] is empty"):
        RunConfig().with_overrides(['train.sample_prompts=["a", " "]'])
    with pytest.raises(ConfigError, match="neither a list of prompts nor a number"):
        RunConfig().with_overrides(["train.sample_prompts=[1, 2]"])
    with pytest.raises(ConfigError, match=r"data\.eval is empty"):
        RunConfig().with_overrides(["train.eval_checkpoints=true"])
    with pytest.raises(ConfigError, match="a dpo run's rows are pairs"):
        RunConfig().with_overrides(["train.eval_checkpoints=true", "train.method=dpo", 'data.eval=["x.jsonl"]'])
