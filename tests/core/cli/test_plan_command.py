"""`hone plan`: the predicted peak by part and auto-fit's choice, from a model's config alone; exit 3 when nothing
fits."""

from __future__ import annotations

import json
import subprocess
import sys


def hone(*args, cwd):
    return subprocess.run(
        [sys.executable, "-m", "hone.core.cli", *map(str, args)], capture_output=True, text=True, cwd=cwd, timeout=300
    )


def write_run(tmp_path, model, batch_tokens=16384, max_length=2048, speed=""):
    run = tmp_path / "run.toml"
    run.write_text(
        f'[model]\nname_or_path = "{model}"\n[train]\nbatch_tokens = {batch_tokens}\n'
        f"[data]\nmax_length = {max_length}\n" + (f"[speed]\n{speed}\n" if speed else "")
    )
    return run


def test_plan_a_model_folder_that_fits(tmp_path, tiny_model_dir):
    run = write_run(tmp_path, tiny_model_dir("tiny-dense").as_posix(), batch_tokens=4096)
    done = hone("plan", run, "--gpu-memory", "8GiB", "--json", tmp_path / "plan.json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "predicted peak of one step" in done.stdout and "Fits" in done.stdout
    record = json.loads((tmp_path / "plan.json").read_text())
    assert record["fit"]["fits"] and record["fit"]["changes"] == []
    assert record["shape"]["layers"] == 2 and record["peak_gib"] > 0
    # a tiny model on 8 GiB: memory to spare, so the run leaves its MLPs whole and (keep_layer_activations = auto,
    # the default) keeps every layer's activations instead of recomputing them, and the plan says so
    spare = record["fit"]["spare"]
    assert spare["whole_mlp"] and spare["kept_layers"] == 2 and spare["peak_gib"] >= record["peak_gib"]
    said = " ".join(done.stdout.split())  # rich wraps the lines
    assert "each MLP is back-propagated whole" in said and "all 2 layers keep their activations" in said
    assert not list(tmp_path.glob("runs*"))  # planning creates no run folder


def test_qwen3_8b_on_an_8_gib_card(tmp_path):
    run = write_run(tmp_path, "dense-8b", batch_tokens=4096, max_length=4096)
    refused = hone("plan", run, "--gpu-memory", "8GiB", cwd=tmp_path)
    assert refused.returncode == 3
    assert "Nothing fits" in refused.stdout and "QLoRA" in refused.stdout
    allowed = hone("plan", run, "--gpu-memory", "8GiB", "--allow-qlora", "--json", tmp_path / "p.json", cwd=tmp_path)
    assert allowed.returncode == 0
    fit = json.loads((tmp_path / "p.json").read_text())["fit"]
    assert fit["settings"]["qlora"] and fit["peak_gib"] < 8 * 0.9


def test_a_bad_memory_size_is_a_user_error(tmp_path):
    done = hone("plan", write_run(tmp_path, "dense-0.6b"), "--gpu-memory", "lots", cwd=tmp_path)
    assert done.returncode == 2 and "cannot read the memory size 'lots'" in done.stderr
