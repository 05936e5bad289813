"""`hone bench S --max-length`: the search for each run's longest one-step row, and the command around it."""

from __future__ import annotations

import json

import pytest
import torch

from hone.core.bench.hone_runner import HoneRunner
from hone.core.bench.max_length import Trial, search_longest
from hone.core.cli import main

pytestmark = pytest.mark.core


def capacity(tokens: int, failed_at: int | None = None):
    """A trial that trains rows up to `tokens` and runs out of memory past them (fails outright at `failed_at`)."""
    tried: list[int] = []

    def trial(length: int) -> Trial:
        tried.append(length)
        if length == failed_at:
            return Trial(length, "failed", "RuntimeError: boom")
        return Trial(length, "ok" if length <= tokens else "oom", "" if length <= tokens else "CUDA out of memory")

    return trial, tried


def test_doubles_then_bisects_to_the_granularity():
    trial, tried = capacity(5000)
    found = search_longest(trial, start=1024, limit=1 << 20, granularity=128)
    assert found.longest == 4992 and found.first_failing == 5120  # 4992 = 39 x 128 <= 5000 < 5120
    assert tried[:4] == [1024, 2048, 4096, 8192]
    assert all(length % 128 == 0 for length in tried) and len(tried) == len(set(tried))
    assert len(tried) <= 4 + 5  # log2(8192 - 4096) - log2(128) halvings
    assert found.status == "ok" and [t.length for t in found.trials] == tried


def test_a_start_that_does_not_fit_searches_downwards():
    trial, _ = capacity(300)
    found = search_longest(trial, start=1024, limit=4096, granularity=128)
    assert (found.longest, found.first_failing) == (256, 384)


def test_nothing_fits_and_everything_fits():
    trial, tried = capacity(5)
    found = search_longest(trial, start=64, limit=512, granularity=8)
    assert found.longest is None and found.first_failing == 8 and tried == [64, 32, 16, 8]
    trial, tried = capacity(10**9)
    found = search_longest(trial, start=64, limit=1000, granularity=8)
    assert (found.longest, found.first_failing) == (1000, None) and tried == [64, 128, 256, 512, 1000]


def test_a_failure_other_than_memory_ends_the_search_with_its_reason():
    trial, tried = capacity(5000, failed_at=2048)
    found = search_longest(trial, start=1024, limit=1 << 20, granularity=128)
    assert found.status == "failed" and "boom" in found.reason and tried == [1024, 2048]
    assert found.longest == 1024


@pytest.fixture
def out_of_memory_past_100_tokens(monkeypatch):
    """Hone's runs step as usual up to 100 tokens and run out of memory past them, as a capped GPU would."""
    real_step = HoneRunner.step

    def step(self):
        if self.batch.tokens > 100:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return real_step(self)

    monkeypatch.setattr(HoneRunner, "step", step)


@pytest.mark.usefixtures("out_of_memory_past_100_tokens")
def test_bench_max_length_on_the_cpu_finds_where_a_run_runs_out_of_memory(tmp_path):
    """A real tiny run whose step runs out of memory past 100 tokens (as a capped GPU would): the search
    measures it trial by trial and reports 96, the longest multiple of its 8-token steps that trains."""
    out = tmp_path / "longest.json"
    code = main(["bench", "tiny-llama", "--max-length", "512", "--only", "reference,all", "--json", str(out)])
    report = json.loads(out.read_text())
    runs = {run["name"]: run for run in report["runs"]}
    assert code == 0 and report["kind"] == "max-length"
    assert runs["reference"]["longest"] == 512 and runs["reference"]["first_failing"] is None
    assert runs["all"]["longest"] == 96 and runs["all"]["first_failing"] == 104
    assert [t["length"] for t in runs["all"]["trials"]] == [64, 128, 96, 112, 104]
    assert runs["all"]["trials"][1]["status"] == "oom"
    # the host memory of offloaded layer inputs: reported by a run that checkpoints (on the CPU none does)
    assert runs["all"]["trials"][0]["host_gib"] is None and runs["reference"]["trials"][0]["host_gib"] is None
    # and the host memory each trial had before its run was built, which the planner's host share comes from
    assert all(0 < trial["host_available_gib"] < 1 << 20 for run in runs.values() for trial in run["trials"])


@pytest.mark.usefixtures("out_of_memory_past_100_tokens")
def test_the_search_starts_where_max_length_from_says(tmp_path):
    """--max-length-from: the first length tried, so that a length whose single step takes minutes on a GPU is tried
    without the doublings below it; the bisection's steps are an eighth of it."""
    out = tmp_path / "longest.json"
    args = ["bench", "tiny-llama", "--max-length", "512", "--max-length-from", "96", "--only", "all"]
    assert main([*args, "--json", str(out)]) == 0
    run = next(run for run in json.loads(out.read_text())["runs"] if run["name"] == "all")
    assert [t["length"] for t in run["trials"]] == [96, 192, 144, 120, 108]
    assert run["longest"] == 96 and run["first_failing"] == 108


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--max-length", "256", "--max-length-from", "512"], "--max-length-from 512: the first length tried"),
        (["--max-length", "256", "--max-length-from", "8"], "--max-length-from 8: the first length tried"),
        (["--max-length-from", "512"], "--max-length-from is where --max-length's search starts"),
    ],
)
def test_a_start_outside_the_search_is_refused(args, said, capsys):
    assert main(["bench", "tiny-llama", *args]) == 2
    assert said in capsys.readouterr().err


def test_max_length_refuses_the_batch_flags(capsys):
    assert main(["bench", "tiny-llama", "--max-length", "256", "--tokens", "512"]) == 2
    assert "--max-length searches the row length itself" in capsys.readouterr().err
