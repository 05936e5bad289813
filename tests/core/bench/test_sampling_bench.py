"""`hone bench tiny-grpo`: the samplers timed on one batch of prompts × answers, ratios against generate."""

from __future__ import annotations

import pytest

from hone.core.bench.sampling import BASELINE, GROUP, PROMPTS, run_sampling_bench
from hone.core.errors import ConfigError

pytestmark = pytest.mark.core


def test_the_sampling_bench_times_every_sampler_on_the_same_batch():
    seen = []
    report = run_sampling_bench(
        "tiny-grpo",
        steps=1,
        warmup=0,
        layers=1,
        completion=3,
        whole_steps=False,
        on_result=lambda r, q: seen.append(r.name),
    )
    assert seen == [BASELINE, "hone-eager"]  # no GPU here: nothing to capture
    data = report.to_dict()
    assert "lora" in data["batch"]["kernels"]  # hone-eager samples with the fused LoRA layers a GRPO run has
    assert data["batch"]["rows"] == PROMPTS * GROUP and data["batch"]["completion_tokens"] == 3
    for run in data["runs"]:
        assert not run["error"] and run["tokens_per_call"] == PROMPTS * GROUP * 3
        assert run["tokens_per_s"] > 0 and len(run["seconds"]) == 1
    assert data["runs"][0]["speed_ratio"] == 1.0


def test_the_sampling_bench_refuses_other_scenarios_and_real_ones_without_a_gpu():
    with pytest.raises(ConfigError, match="not a sampling one"):
        run_sampling_bench("tiny-dense")
    with pytest.raises(ConfigError, match="needs a CUDA GPU"):
        run_sampling_bench("grpo-0.6b")


def test_hone_bench_tiny_grpo_profiles_each_sampler_and_times_the_whole_step_against_trl_and_the_peer(
    capsys, tmp_path, stand_in_unsloth
):
    """The peer's whole steps come from its child process (on the stand-in package here: TRL's GRPOTrainer on a
    model the peer's loader and LoRA calls made)."""
    import json

    from hone.core.cli import main

    out_json = tmp_path / "grpo.json"
    argv = ["bench", "tiny-grpo", "--steps", "1", "--warmup", "0", "--layers", "1", "--tokens", "2", "--profile"]
    code = main([*argv, "--peer", "unsloth", "--json", str(out_json)])
    out = capsys.readouterr().out
    assert code == 0, out
    for name in (BASELINE, "hone-eager"):
        assert f"profile of {name}: one step" in out and f"{name}: top kernels" in out
    data = json.loads(out_json.read_text())
    assert [r["name"] for r in data["steps"]] == ["trl", "hone", "unsloth"]
    for run in data["steps"]:
        assert not run["error"] and run["median_s"] > 0 and run["trainable"] > 0, run["details"]
    # the same LoRA on the same model: the trainers train the same parameters
    assert data["steps"][0]["trainable"] == data["steps"][1]["trainable"] == data["steps"][2]["trainable"]
    assert "stand-in" in data["steps"][2]["description"]
    assert data["step_speed_ratio"] > 0 and data["peer_step_speed_ratio"] > 0
    assert "as fast as TRL's" in out and "as fast as unsloth's" in out


def test_the_peer_needs_the_whole_steps():
    with pytest.raises(ConfigError, match="--peer unsloth trains whole GRPO steps"):
        run_sampling_bench("tiny-grpo", whole_steps=False, peer="unsloth")
