"""`hone bench` end to end on tiny scenarios (CPU, fp32): the command runs, the JSON holds every field, Hone's
first-step loss equals the reference's and a loss computed here sequence by sequence, out-of-memory in one run is
recorded while the others finish, and --only picks the runs."""

from __future__ import annotations

import dataclasses
import importlib.util
import json

import pytest
import torch
import torch.nn.functional as F

from hone.core.bench.batch import make_batch
from hone.core.bench.hone_runner import HoneRunner
from hone.core.bench.measure import RunResult
from hone.core.bench.peer_unsloth import run_unsloth_peer
from hone.core.bench.scenarios import get_scenario
from hone.core.cli import main
from hone.core.models.shapes import build_model

FAST = ["--tokens", "96", "--steps", "1", "--warmup", "1"]
TOP_LEVEL = {
    "schema",
    "scenario",
    "options",
    "device",
    "dtype",
    "batch",
    "architecture",
    "environment",
    "matmul_tflops",
    "mfu_roof",
    "flops_convention",
    "baseline",
    "parity_tolerance",
    "runs",
    "attention_micro",
    "elapsed_s",
}


def expected_first_loss(shape: str, batch_info: dict) -> float:
    """Mean next-token cross-entropy of the untrained model, each sequence run on its own (no packing, no mask)."""
    batch = make_batch(
        batch_info["tokens"],
        batch_info["vocab_size"],
        seed=batch_info["seed"],
        min_len=batch_info["min_len"],
        max_len=batch_info["max_len"],
    )
    model = build_model(shape, seed=0, dtype=torch.float32).eval()
    total, count = 0.0, 0
    with torch.no_grad():
        for row in batch.rows():
            ids = torch.tensor(row.input_ids)
            logits = model(input_ids=ids[None]).logits[0].float()
            total += F.cross_entropy(logits[:-1], ids[1:], reduction="sum").item()
            count += len(ids) - 1
    return total / count


def bench(tmp_path, *args) -> tuple[int, dict | None]:
    out = tmp_path / "bench.json"
    code = main(["bench", *args, "--json", str(out)])
    return code, json.loads(out.read_text()) if out.is_file() else None


@pytest.fixture(scope="module")
def dense_record(tmp_path_factory):
    previous = torch.get_num_threads()
    torch.set_num_threads(1)  # module-scoped, so the function-scoped one-thread fixture does not cover it
    try:
        return bench(
            tmp_path_factory.mktemp("bench"),
            "tiny-dense",
            *FAST,
            "--micro",
            "on",
            "--only",
            "hone-base,loss-chunked,attn-varlen",
            "--run",
            "attn-sdpa-per-layer=attn-sdpa,bench.per_layer_metadata=true",
        )
    finally:
        torch.set_num_threads(previous)


def test_tiny_dense_runs_and_the_json_has_every_field(dense_record):
    code, data = dense_record
    assert code == 0
    assert set(data) == TOP_LEVEL
    assert [r["name"] for r in data["runs"]] == [
        "reference",
        "hone-base",
        "attn-varlen",
        "loss-chunked",
        "attn-sdpa-per-layer",
    ]
    fields = {f.name for f in dataclasses.fields(RunResult)}
    for run in data["runs"]:
        assert set(run) == fields, run["name"]
    assert data["batch"]["tokens"] == 96 and data["dtype"] == "float32" and data["device"] == "cpu"
    assert data["environment"]["packages"]["torch"].startswith(torch.__version__.split("+")[0])
    assert data["architecture"]["layers"] == 2


def test_the_attention_micro_benchmark_gets_the_batch_and_the_geometry(dense_record):
    _, data = dense_record
    micro = data["attention_micro"]
    assert micro["status"] == "ok", micro.get("details") or micro["reason"]
    result = micro["result"]
    assert (result["tokens"], result["sequences"]) == (96, data["batch"]["sequences"])
    assert (result["heads"], result["kv_heads"], result["head_dim"]) == (4, 2, 16)
    assert result["mask_builds_per_layer_ours"] == pytest.approx(1 / data["architecture"]["layers"])


def test_tiny_dense_runs_measure_and_agree_with_the_reference(dense_record):
    _, data = dense_record
    runs = {r["name"]: r for r in data["runs"]}
    varlen = runs.pop("attn-varlen")
    assert varlen["status"] == "skipped" and varlen["reason"] == "needs a CUDA GPU"
    expected = expected_first_loss("tiny-dense", data["batch"])
    for name, run in runs.items():
        assert run["status"] == "ok", f"{name}: {run['reason']}\n{run['details']}"
        assert run["tokens_per_s"] > 0 and len(run["step_times_s"]) == 1
        assert run["first_loss"] == pytest.approx(expected, rel=1e-5), (
            f"{name}: first-step loss {run['first_loss']:.6f}, computed sequence by sequence {expected:.6f}"
        )
        assert run["parity"] is True, f"{name}: loss diff {run['loss_diff']}, grad norm {run['grad_norm_rel_diff']}"
        assert run["trainable_params"] == runs["reference"]["trainable_params"] > 0
        assert run["speed_paths"]["adapted"] == "down_proj, gate_proj, k_proj, o_proj, q_proj, up_proj, v_proj"
    assert runs["reference"]["speed_ratio"] == 1.0
    assert runs["loss-chunked"]["speed_paths"]["loss"].startswith("chunked")
    assert runs["hone-base"]["speed_paths"]["loss"].startswith("plain")
    per_layer = runs["attn-sdpa-per-layer"]["speed_paths"]["attention"]
    assert per_layer.startswith("sdpa") and "metadata rebuilt in every layer (hone_blockmask_per_layer" in per_layer


def test_on_a_cpu_there_is_no_mfu_and_gpu_only_runs_are_skipped(tmp_path, capsys):
    """A CPU's matmul rate is no roof (it moves with the load): no run gets an MFU and the report says why. Runs
    whose path exists only on a GPU are skipped with the reason; the baseline is still measured."""
    code, data = bench(
        tmp_path,
        "tiny-dense",
        *FAST,
        "--micro",
        "off",
        "--no-sync-count",
        "--only",
        "kernels,ckpt-offload",
        "--run",
        "all-untiled=all,speed.tiled_mlp=false",
        "--run",
        "all-groups-4k=all,speed.layer_group_tokens=4096",
        "--run",
        "all-embed-gpu=all,speed.host_embeddings=false",
    )
    out = capsys.readouterr().out
    assert code == 0
    assert data["matmul_tflops"] is None
    assert data["mfu_roof"]["tflops"] is None and data["mfu_roof"]["source"] == "none"
    assert data["mfu_roof"]["note"].startswith("no MFU on a CPU")
    assert "no MFU on a CPU" in out and "--peak-flops" in out
    runs = {r["name"]: r for r in data["runs"]}
    assert all(r["mfu"] is None for r in runs.values())
    reference = runs.pop("reference")
    assert reference["status"] == "ok" and reference["tokens_per_s"] > 0 and reference["first_loss"] > 0
    assert {name: (r["status"], r["reason"]) for name, r in runs.items() if name != "all-groups-4k"} == {
        name: ("skipped", "needs a CUDA GPU") for name in ("kernels", "all-untiled", "ckpt-offload", "all-embed-gpu")
    }
    groups = runs["all-groups-4k"]
    assert groups["status"] == "skipped" and groups["tokens_per_s"] is None
    assert groups["reason"].startswith(
        "speed.layer_group_tokens = 4096 is not in effect in this run (it reports checkpoint: off"
    )


def test_a_given_peak_gives_mfu_on_a_cpu(tmp_path, capsys):
    code, data = bench(
        tmp_path,
        "tiny-dense",
        *FAST,
        "--micro",
        "off",
        "--no-sync-count",
        "--only",
        "reference",
        "--peak-flops",
        "2e12",
    )
    assert code == 0
    assert data["mfu_roof"] == {
        "tflops": 2.0,
        "source": "given",
        "note": "MFU against the given peak of 2 TFLOP/s (--peak-flops)",
    }
    assert data["matmul_tflops"] is None  # nothing was measured
    [run] = data["runs"]
    # 6 FLOPs per parameter a token passes through, per token, over the median step, against the given peak
    expected = 6 * run["active_params"] * data["batch"]["tokens"] / run["median_step_s"] / 2e12
    assert run["active_params"] > 0 and run["mfu"] == pytest.approx(expected, rel=1e-12)
    assert "MFU against the given peak of 2 TFLOP/s (--peak-flops), counting 6 x N FLOPs" in capsys.readouterr().out


@pytest.mark.parametrize("peak", ["0", "-1e12", "nan"])
def test_a_peak_that_is_no_rate_is_an_error(tmp_path, capsys, peak):
    code, data = bench(tmp_path, "tiny-dense", *FAST, f"--peak-flops={peak}")
    assert code == 2 and data is None
    assert "a peak rate is a positive number of FLOP/s" in capsys.readouterr().err


def test_out_of_memory_in_one_run_is_recorded_and_the_others_finish(tmp_path, monkeypatch):
    real_step = HoneRunner.step

    def step(self):
        if self.name == "hone-base":
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 9.27 GiB")
        return real_step(self)

    monkeypatch.setattr(HoneRunner, "step", step)
    code, data = bench(tmp_path, "tiny-dense", *FAST, "--only", "hone-base,loss-chunked", "--no-sync-count")
    assert code == 0
    runs = {r["name"]: r for r in data["runs"]}
    assert runs["hone-base"]["status"] == "oom"
    assert runs["hone-base"]["reason"] == "CUDA out of memory. Tried to allocate 9.27 GiB"
    assert runs["hone-base"]["tokens_per_s"] is None and runs["hone-base"]["speed_ratio"] is None
    assert runs["loss-chunked"]["status"] == "ok" and runs["loss-chunked"]["parity"] is True


def test_only_names_no_run_is_an_error(tmp_path, capsys):
    code, data = bench(tmp_path, "tiny-dense", *FAST, "--only", "no-such-run")
    assert code == 2 and data is None
    assert "--only 'no-such-run' matches no run" in capsys.readouterr().err


def test_a_run_of_ones_own_runs_against_the_baseline_and_is_recorded(tmp_path):
    """--run without --only: the reference and that run alone; its settings in the record, its loss the one
    computed here sequence by sequence, and it can be the baseline."""
    spec = "mine=hone-base,speed.loss=chunked"
    code, data = bench(tmp_path, "tiny-dense", *FAST, "--micro", "off", "--no-sync-count", "--run", spec)
    assert code == 0
    assert data["options"]["extra_runs"] == [spec]
    runs = {r["name"]: r for r in data["runs"]}
    assert list(runs) == ["reference", "mine"]
    mine = runs["mine"]
    assert mine["status"] == "ok", f"{mine['reason']}\n{mine['details']}"
    assert mine["description"] == "hone-base, with speed.loss = chunked"
    assert mine["overrides"] == {
        "packing": True,
        "attention": "hf",
        "loss": "chunked",
        "checkpoint": "gpu",
        "moe_backend": "eager",
        "kernels": False,
        "compile": False,
        "keep_layer_activations": 0,
    }
    assert mine["speed_paths"]["loss"].startswith("chunked")
    assert mine["first_loss"] == pytest.approx(expected_first_loss("tiny-dense", data["batch"]), rel=1e-5)
    assert mine["parity"] is True

    code, data = bench(
        tmp_path, "tiny-dense", *FAST, "--micro", "off", "--no-sync-count", "--only", "hone-base", "--baseline", "mine",
        "--run", spec,
    )  # fmt: skip
    assert code == 0
    runs = {r["name"]: r for r in data["runs"]}
    assert list(runs) == ["hone-base", "mine"] and runs["mine"]["speed_ratio"] == 1.0
    assert runs["hone-base"]["speed_ratio"] == pytest.approx(
        runs["hone-base"]["tokens_per_s"] / runs["mine"]["tokens_per_s"], rel=1e-9
    )


def test_a_run_that_cannot_mean_a_run_is_an_error_before_anything_runs(tmp_path, capsys):
    code, data = bench(tmp_path, "tiny-dense", *FAST, "--run", "mine=all,speed.checkpoint=sometimes")
    assert code == 2 and data is None
    captured = capsys.readouterr()
    assert "--run 'mine=all,speed.checkpoint=sometimes': speed.checkpoint is 'sometimes'" in captured.err
    assert "reference ..." not in captured.out  # refused before the first run started


def test_tiny_moe_references_agree_with_a_sequence_by_sequence_loss(tmp_path):
    code, data = bench(tmp_path, "tiny-moe-qwen3", *FAST, "--only", "reference*", "--no-sync-count")
    assert code == 0
    runs = {r["name"]: r for r in data["runs"]}
    assert set(runs) == {"reference", "reference-eager"}
    assert runs["reference"]["speed_paths"]["moe"].startswith("grouped_mm")
    assert runs["reference-eager"]["speed_paths"]["moe"].startswith("eager")
    expected = expected_first_loss("tiny-moe-qwen3", data["batch"])
    for run in runs.values():
        assert run["status"] == "ok", run["details"]
        assert run["first_loss"] == pytest.approx(expected, rel=1e-5)
        assert run["parity"] is True
    # LoRA on attention and on the stacked experts (peft target_parameters), the same in both.
    assert runs["reference"]["trainable_params"] == runs["reference-eager"]["trainable_params"] > 0


@pytest.mark.skipif(
    importlib.util.find_spec("hone.core.speed.moe") is None,
    reason="the MoE speed path (hone.core.speed.moe) is not in this build",
)
def test_tiny_moe_hone_runs_match_the_reference(tmp_path):
    code, data = bench(tmp_path, "tiny-moe-qwen3", *FAST, "--only", "hone-base,moe-torch", "--no-sync-count")
    assert code == 0
    runs = {r["name"]: r for r in data["runs"]}
    for name in ("hone-base", "moe-torch"):
        assert runs[name]["status"] == "ok", f"{name}: {runs[name]['reason']}\n{runs[name]['details']}"
        assert runs[name]["parity"] is True, (name, runs[name]["loss_diff"], runs[name]["grad_norm_rel_diff"])


@pytest.mark.skipif(
    importlib.util.find_spec("hone.core.speed.moe") is None,
    reason="the MoE speed path (hone.core.speed.moe) is not in this build",
)
def test_lora_experts_off_puts_hone_and_the_reference_on_the_same_smaller_set(tmp_path):
    runs = {}
    for setting in ("on", "off"):
        code, data = bench(
            tmp_path / setting,
            "tiny-moe-qwen3",
            *FAST,
            "--only",
            "hone-base",
            "--no-sync-count",
            "--lora-experts",
            setting,
        )
        assert code == 0 and data["options"]["lora_experts"] is (setting == "on")
        runs[setting] = {r["name"]: r for r in data["runs"]}
    on, off = runs["on"], runs["off"]
    assert off["reference"]["trainable_params"] == off["hone-base"]["trainable_params"]
    assert 0 < off["reference"]["trainable_params"] < on["reference"]["trainable_params"]
    assert on["reference"]["trainable_params"] == on["hone-base"]["trainable_params"]
    assert "expert" not in off["reference"]["speed_paths"]["lora"]
    for run in (*on.values(), *off.values()):
        assert run["parity"] is True, (run["name"], run["parity_reason"], run["loss_diff"])


@pytest.mark.skipif(importlib.util.find_spec("unsloth") is not None, reason="unsloth is installed here")
def test_the_unsloth_peer_is_skipped_when_it_is_not_installed():
    result = run_unsloth_peer({})
    assert result.status == "skipped" and result.reason == "unsloth is not installed" and result.kind == "peer"


def test_qlora_on_a_cpu_is_recorded_as_skipped_for_every_run(tmp_path):
    code, data = bench(tmp_path, "tiny-dense", *FAST, "--qlora", "--only", "hone-base")
    assert code == 1  # nothing could run
    assert [(r["name"], r["status"], r["reason"]) for r in data["runs"]] == [
        ("reference", "skipped", "QLoRA needs a CUDA GPU"),
        ("hone-base", "skipped", "QLoRA needs a CUDA GPU"),
    ]


def test_list_shows_scenarios_and_runs(capsys):
    assert main(["bench", "--list"]) == 0
    out = capsys.readouterr().out
    for name in (
        "dense-0.6b",
        "dense-8b-long",
        "dense-0.6b-long",
        "moe-qwen3",
        "tiny-dense",
        "reference-eager",
        "attn-sdpa",
        "all-long-rows-recompute",
        "all",
        "--run NAME=RUN,SETTING=VALUE",
    ):
        assert name in out
    for name in ("attn-varlen-per-layer", "all-offload-double-groups-8k", "all-head-gpu"):  # --run runs
        assert name not in out


def test_the_long_row_scenarios_train_a_few_rows_of_16_to_32k_tokens():
    for name, shape in (("dense-8b-long", "dense-8b"), ("dense-0.6b-long", "dense-0.6b")):
        scenario = get_scenario(name)
        batch = make_batch(scenario.tokens, 1000, seed=0, min_len=scenario.min_len, max_len=scenario.max_len)
        assert scenario.shape == shape and batch.tokens == 65536
        assert 2 <= len(batch.lengths) <= 4 and max(batch.lengths) <= 32768
        assert all(length >= 16384 for length in batch.lengths[:-1])  # the last one may take what is left


def test_moving_vocabulary_tables_to_the_host_leaves_the_counted_parameters_alone(tmp_path, monkeypatch):
    """MFU counts what a token is computed with: a table moved to host memory still counts (the runs agree with
    and without the move)."""
    import hone.core.speed.host_tables as host_embedding

    move = host_embedding.apply_host_tables
    out = tmp_path / "bench.json"
    args = [
        "bench",
        "tiny-llama",
        "--tokens",
        "48",
        "--steps",
        "1",
        "--warmup",
        "0",
        "--only",
        "loss-chunked",
        "--baseline",
        "loss-chunked",
        "--micro",
        "off",
        "--no-sync-count",
        "--json",
        str(out),
    ]
    assert main(args) == 0
    kept = json.loads(out.read_text())["runs"][0]
    monkeypatch.setattr(host_embedding, "apply_host_tables", lambda *a, **k: move(*a, **{**k, "force": True}))
    assert main(args) == 0
    moved = json.loads(out.read_text())["runs"][0]
    assert "pinned host memory" in moved["speed_paths"]["lm_head"], moved["speed_paths"]
    assert moved["active_params"] == kept["active_params"] > 0


def test_a_memory_cap_on_a_cpu_is_an_error_before_anything_runs(tmp_path, capsys):
    code, data = bench(tmp_path, "tiny-dense", *FAST, "--memory-cap", "8GiB")
    assert code == 2 and data is None
    assert "--memory-cap works on a CUDA GPU, not on cpu" in capsys.readouterr().err


def test_a_memory_cap_that_is_no_size_is_refused_by_the_parser(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["bench", "tiny-dense", "--memory-cap", "lots"])
    assert exit_.value.code == 2
    assert "cannot read the memory size 'lots'" in capsys.readouterr().err
