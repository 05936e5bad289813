"""`hone bench vision-qwen2.5-vl` on a CPU: the scenario is listed, refuses cleanly without a GPU (before it builds
anything) and refuses the text scenarios' flags; with its two runs replaced by doubles, the numbers they report
become the same ratio table and JSON record as a text scenario's (the real runs are in tests/core/vision GPU tests)."""

from __future__ import annotations

import json

import pytest
import torch

from hone.core.bench import vision
from hone.core.bench.run import BenchOptions, run_bench
from hone.core.cli import main
from hone.core.errors import ConfigError

SCENARIO = "vision-qwen2.5-vl"


@pytest.fixture
def nothing_built(monkeypatch):
    """Fail the test if the benchmark gets as far as generating data or building the model."""

    def refuse(*args, **kwargs):
        raise AssertionError("the benchmark went on to build its data or model")

    monkeypatch.setattr(vision, "make_data", refuse)
    monkeypatch.setattr(vision, "model_folder", refuse)


def test_the_vision_scenarios_are_listed(capsys):
    assert main(["bench", "--list"]) == 0
    out = capsys.readouterr().out
    assert SCENARIO in out and "Qwen2.5-VL-3B" in out
    assert "vision-smolvlm" in out and "SmolVLM-Instruct" in out


def test_the_smolvlm_scenario_builds_smolvlm_instruct_sizes(smollm2_tokenizer_dir):
    """SmolVLM-Instruct: 2.25B parameters (SmolLM2-1.7B text, SigLIP so400m vision), 81 image tokens per 384 px
    tile ((384 / 14)^2 patches merged 3 x 3). Built on the meta device: no weights."""
    from transformers import AutoModelForImageTextToText

    from hone.core.bench.scenarios import get_scenario
    from hone.core.vision import tiny

    scenario = get_scenario("vision-smolvlm")
    tokenizer = tiny.vision_tokenizer(scenario.shape, smollm2_tokenizer_dir)
    config = tiny.model_config(scenario.shape, tokenizer, shape="real")
    with torch.device("meta"):
        model = AutoModelForImageTextToText.from_config(config, dtype=torch.bfloat16)
    assert type(model).__name__ == "Idefics3ForConditionalGeneration"
    assert 2.24e9 < sum(p.numel() for p in model.parameters()) < 2.26e9
    assert config.text_config.num_hidden_layers == scenario.layers == 24
    vision_config = config.vision_config
    assert (vision_config.image_size // vision_config.patch_size) ** 2 // config.scale_factor**2 == 81


def test_without_a_gpu_it_refuses_before_building_anything(monkeypatch, nothing_built, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert main(["bench", SCENARIO, "--layers", "4"]) == 2
    err = capsys.readouterr().err
    assert f"the {SCENARIO} benchmark needs a CUDA GPU and there is none here" in err


def test_flags_of_the_text_scenarios_are_refused_not_ignored(nothing_built, capsys):
    assert main(["bench", SCENARIO, "--qlora", "--seq-max", "512"]) == 2
    assert f"--qlora, --seq-max: not used by the vision scenario {SCENARIO}" in capsys.readouterr().err
    assert main(["bench", "tiny-dense", "--tokenizer", "."]) == 2
    assert "--tokenizer is for the vision scenarios" in capsys.readouterr().err


def test_the_text_benchmark_refuses_a_vision_scenario():
    with pytest.raises(ConfigError, match="is a vision scenario"):
        run_bench(BenchOptions(scenario=SCENARIO))


def _steps(times, tokens, losses, peak_gib):
    return vision.RunSteps(
        times=times,
        tokens=tokens,
        losses=losses,
        peak_allocated=int(peak_gib * 2**30),
        peak_reserved=int((peak_gib + 1) * 2**30),
        speed_paths={"attention": "double"},
    )


def test_the_two_runs_become_ratios_and_a_json_record(monkeypatch, tmp_path):
    hone = _steps([9.0, 5.0, 1.0, 2.0, 1.0], [100, 200, 400, 600, 500], [2.0, 1.9, 1.8, 1.7, 1.6], peak_gib=3.0)
    reference = _steps([9.0, 5.0, 2.0, 4.0, 2.0], [100, 200, 400, 600, 500], [2.2, 2.1, 2.0, 1.9, 1.8], peak_gib=6.0)
    calls = {}

    def run_double(steps_out, name):
        def run(*args, **kwargs):
            calls[name] = kwargs
            return steps_out

        return run

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    for name in ("free_memory", "allocated_gib"):
        monkeypatch.setattr(vision, name, lambda device: None)
    monkeypatch.setattr(vision, "environment", lambda device: {"gpu": "test double"})
    monkeypatch.setattr(vision, "make_data", lambda folder: folder / "train.jsonl")
    monkeypatch.setattr(vision, "model_folder", lambda folder, family, layers, tokenizer: folder / "model")
    monkeypatch.setattr(vision, "hone_steps", run_double(hone, "hone"))
    monkeypatch.setattr(vision, "reference_steps", run_double(reference, "reference"))
    out = tmp_path / "vision.json"
    assert (
        main(
            [
                "bench",
                SCENARIO,
                "--layers",
                "4",
                "--steps",
                "3",
                "--warmup",
                "2",
                "--tokens",
                "4096",
                "--tokenizer",
                str(tmp_path),
                "--json",
                str(out),
            ]
        )
        == 0
    )

    assert calls["hone"] == {
        "steps": 5,
        "warmup": 2,
        "batch_tokens": 4096,
        "lora_r": 16,
        "overrides": (),
        "profile_top": 0,
    }
    assert calls["reference"] == {"steps": 5, "warmup": 2, "batch_tokens": 4096, "lora_r": 16}
    data = json.loads(out.read_text())
    runs = {r["name"]: r for r in data["runs"]}
    assert [r["name"] for r in data["runs"]] == ["hone", "reference"] and data["baseline"] == "reference"
    # tokens/s: real tokens of the three timed steps over their summed time
    assert runs["hone"]["tokens_per_s"] == pytest.approx(1500 / 4.0)
    assert runs["reference"]["tokens_per_s"] == pytest.approx(1500 / 8.0)
    assert runs["hone"]["median_step_s"] == 1.0 and runs["hone"]["tokens"] == 500
    assert runs["hone"]["speed_ratio"] == pytest.approx(2.0) and runs["hone"]["memory_ratio"] == pytest.approx(0.5)
    assert runs["hone"]["peak_allocated_gib"] == pytest.approx(3.0)
    assert runs["hone"]["peak_reserved_gib"] == pytest.approx(4.0)
    # packed vs padded batches: the loss difference is recorded, parity is not claimed
    assert runs["hone"]["loss_diff"] == pytest.approx(-0.2) and runs["hone"]["parity"] is None
    assert data["losses"] == {"hone": [2.0, 1.9, 1.8, 1.7, 1.6], "reference": [2.2, 2.1, 2.0, 1.9, 1.8]}
    assert data["batch"]["layers"] == 4 and data["batch"]["tokens_per_batch"] == 4096


def _doubles(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    for name in ("free_memory", "allocated_gib"):
        monkeypatch.setattr(vision, name, lambda device: None)
    monkeypatch.setattr(vision, "environment", lambda device: {})
    monkeypatch.setattr(vision, "make_data", lambda folder: folder / "train.jsonl")
    monkeypatch.setattr(vision, "model_folder", lambda folder, family, layers, tokenizer: folder / "model")


def test_only_picks_hone_runs_with_memory_paths_turned_off(monkeypatch, tmp_path, capsys):
    """--only: Hone's Trainer with the settings of each named run (the reference always runs); a name that is no
    vision run is refused before anything is built."""
    _doubles(monkeypatch)
    asked = {}

    def hone(*args, overrides=(), **kwargs):
        asked[overrides] = kwargs
        return _steps([9.0, 1.0], [100, 400], [2.0, 1.9], peak_gib=2.0)

    monkeypatch.setattr(vision, "hone_steps", hone)
    monkeypatch.setattr(
        vision, "reference_steps", lambda *a, **k: _steps([9.0, 4.0], [100, 400], [2.0, 2.0], peak_gib=8.0)
    )
    out = tmp_path / "vision.json"
    assert (
        main(
            [
                "bench",
                SCENARIO,
                "--steps",
                "1",
                "--warmup",
                "1",
                "--only",
                "hone,hone-spare",
                "--tokenizer",
                str(tmp_path),
                "--json",
                str(out),
                "--profile",
                "--profile-top",
                "3",
            ]
        )
        == 0
    )
    runs = [r["name"] for r in json.loads(out.read_text())["runs"]]
    assert runs == ["hone", "hone-spare", "reference"]
    assert all(kwargs["profile_top"] == 3 for kwargs in asked.values())  # --profile: one more step, profiled
    assert set(asked) == {(), ('speed.checkpoint="gpu"', "speed.tiled_mlp=false", "speed.host_lm_head=false")}
    # every override is a setting the config takes
    from hone.core.config import RunConfig

    for _, overrides in vision.HONE_RUNS.values():
        RunConfig().with_overrides(list(overrides))
    assert main(["bench", SCENARIO, "--only", "all", "--tokenizer", str(tmp_path)]) == 2
    assert "--only all: all is not a run of the vision scenarios" in capsys.readouterr().err


def test_the_unsloth_peer_is_a_third_run_against_the_same_reference(monkeypatch, tmp_path):
    """--peer unsloth: the peer's steps (a double here; Unsloth needs a GPU) become a third run with ratios against
    the reference, and each step's wait for data is recorded for Hone's run."""
    from hone.core.bench import peer_unsloth_vision

    _doubles(monkeypatch)
    hone = _steps([9.0, 1.0, 1.0], [100, 400, 400], [2.0, 1.9, 1.8], peak_gib=2.0)
    hone.data_wait = [0.5, 0.0, 0.25]
    monkeypatch.setattr(vision, "hone_steps", lambda *a, **k: hone)
    monkeypatch.setattr(
        vision,
        "reference_steps",
        lambda *a, **k: _steps([9.0, 4.0, 4.0], [100, 400, 400], [2.0, 2.0, 2.0], peak_gib=8.0),
    )
    asked = {}

    def peer(model_dir, data, family, **kwargs):
        asked.update(kwargs, family=family)
        return _steps([9.0, 2.0, 2.0], [100, 400, 400], [2.0, 2.0, 2.0], peak_gib=4.0)

    monkeypatch.setattr(peer_unsloth_vision, "unsloth_vision_steps", peer)
    out = tmp_path / "vision.json"
    assert (
        main(
            [
                "bench",
                SCENARIO,
                "--steps",
                "2",
                "--warmup",
                "1",
                "--peer",
                "unsloth",
                "--tokenizer",
                str(tmp_path),
                "--json",
                str(out),
            ]
        )
        == 0
    )
    assert asked == {"steps": 3, "warmup": 1, "batch_tokens": 8192, "lora_r": 16, "family": "qwen2_5_vl"}
    data = json.loads(out.read_text())
    runs = {r["name"]: r for r in data["runs"]}
    assert list(runs) == ["hone", "reference", "unsloth"] and runs["unsloth"]["kind"] == "peer"
    assert runs["unsloth"]["speed_ratio"] == pytest.approx(2.0) and runs["hone"]["speed_ratio"] == pytest.approx(4.0)
    assert runs["unsloth"]["memory_ratio"] == pytest.approx(0.5)
    assert data["data_wait_s"] == {"hone": [0.5, 0.0, 0.25]}


def test_without_unsloth_the_peer_run_says_so_and_the_others_are_measured(monkeypatch, tmp_path):
    from hone.core.bench import peer_unsloth

    _doubles(monkeypatch)
    monkeypatch.setattr(peer_unsloth, "unsloth_available", lambda: False)
    monkeypatch.setattr(vision, "hone_steps", lambda *a, **k: _steps([1.0, 1.0], [10, 10], [2.0, 2.0], peak_gib=1.0))
    monkeypatch.setattr(
        vision, "reference_steps", lambda *a, **k: _steps([1.0, 2.0], [10, 10], [2.0, 2.0], peak_gib=2.0)
    )
    report = vision.run_vision_bench(
        vision.VisionOptions(SCENARIO, steps=1, warmup=1, tokenizer=str(tmp_path), peer="unsloth")
    )
    peer = report.run("unsloth")
    assert peer.status == "failed" and "unsloth is not installed" in peer.reason
    assert report.run("hone").speed_ratio == pytest.approx(2.0)


def test_a_failed_run_is_recorded_and_the_other_still_measured(monkeypatch, tmp_path):
    _doubles(monkeypatch)

    def out_of_memory(*args, **kwargs):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 3.00 GiB")

    monkeypatch.setattr(vision, "hone_steps", out_of_memory)
    monkeypatch.setattr(
        vision, "reference_steps", lambda *a, **k: _steps([1.0, 1.0, 2.0], [10, 10, 30], [2.0, 2.0, 2.0], peak_gib=1.0)
    )
    report = vision.run_vision_bench(vision.VisionOptions(SCENARIO, steps=1, warmup=2, tokenizer=str(tmp_path)))
    hone, reference = report.run("hone"), report.run("reference")
    assert (hone.status, hone.reason) == ("oom", "CUDA out of memory. Tried to allocate 3.00 GiB")
    assert hone.tokens_per_s is None and hone.speed_ratio is None
    assert reference.status == "ok" and reference.tokens_per_s == pytest.approx(15.0)


@pytest.mark.parametrize("scenario", ["vision-qwen2.5-vl", "vision-smolvlm"])
def test_the_reference_targets_every_language_model_linear_and_no_vision_one(scenario, smollm2_tokenizer_dir):
    """The reference's LoRA regex on the scenario's model (2 text layers, meta device): the seven linears of each
    text layer, nothing in the image encoder."""
    import re

    from transformers import AutoModelForImageTextToText

    from hone.core.bench.scenarios import get_scenario
    from hone.core.vision import tiny

    family = get_scenario(scenario).shape
    config = tiny.model_config(family, tiny.vision_tokenizer(family, smollm2_tokenizer_dir), shape="real", layers=2)
    with torch.device("meta"):
        model = AutoModelForImageTextToText.from_config(config)
    targeted = [name for name, _ in model.named_modules() if re.fullmatch(vision.REFERENCE_TARGETS, name)]
    assert len(targeted) == 2 * 7, targeted
    assert not [name for name in targeted if "vision" in name or "visual" in name]
