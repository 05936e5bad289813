"""Triton grouped GEMM kernels against their float32 references, over a grid of group layouts and dtypes.

On a CPU these run only under Triton's interpreter (TRITON_INTERPRET=1 at import); test_moe_triton_cpu.py runs
them that way in a subprocess. On a GPU: `pytest -m gpu`.
"""

from __future__ import annotations

import json

import pytest
import torch

from hone.kernels.moe.grouped_gemm.launch import (
    grouped_gemm_forward,
    grouped_gemm_reference,
    grouped_gemm_wgrad,
    grouped_gemm_wgrad_reference,
    interpreting,
    triton_runs_on,
)

DEVICES = [pytest.param("cpu", id="interpreter"), pytest.param("cuda", id="cuda", marks=pytest.mark.gpu)]
DTYPES = [torch.float32, torch.bfloat16, torch.float16]
# Relative to the largest reference value: bf16 keeps 8 mantissa bits, fp16 11; float32 sums differ in order only.
TOLERANCE = {torch.float32: 2e-5, torch.bfloat16: 2e-2, torch.float16: 4e-3}

# (name, rows per expert): prime expert counts, an expert with no rows, all rows to one expert, a single row.
LAYOUTS = [
    ("prime7_one_empty", [5, 0, 9, 1, 3, 12, 7]),
    ("all_to_one", [0, 0, 0, 23, 0]),
    ("single_row", [1, 0, 0]),
    ("two_uneven", [40, 3]),
]


@pytest.fixture(autouse=True)
def _untuned_triton(monkeypatch):
    """Triton block sizes from the heuristic: tuning every test shape would spend GPU minutes compiling."""
    monkeypatch.setenv("HONE_TRITON_AUTOTUNE", "0")


def _require(device: str) -> None:
    if device == "cpu" and not interpreting():
        pytest.skip("CPU runs need TRITON_INTERPRET=1 at import (test_moe_triton_cpu.py runs them)")
    if not triton_runs_on(device):
        pytest.skip(f"Triton kernels cannot run on {device} here")


def _group_ends(counts: list[int], device: str) -> torch.Tensor:
    return torch.tensor(counts).cumsum(0).to(device=device, dtype=torch.int32)


def _rel_err(got: torch.Tensor, ref: torch.Tensor) -> float:
    return ((got.float() - ref).abs().max() / ref.abs().max().clamp_min(1e-6)).item()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).removeprefix("torch."))
@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda layout: layout[0])
def test_forward_with_every_fusion_matches_reference(device, dtype, layout):
    _require(device)
    _, counts = layout
    gen = torch.Generator().manual_seed(len(counts))
    experts, rows = len(counts), sum(counts)
    k_dim, n_cols, rank, tokens = 33, 40, 5, 11  # odd sizes: every tile is partial
    x = torch.randn(tokens, k_dim, generator=gen).to(device, dtype)
    # (E, N, K) storage seen as (E, K, N): the transposed layout of Qwen-style experts.
    w = torch.randn(experts, n_cols, k_dim, generator=gen).to(device, dtype).transpose(1, 2)
    gather = torch.randint(0, tokens, (rows,), generator=gen).to(device)
    scatter = torch.randperm(rows, generator=gen).to(device)
    row_scale = torch.rand(rows, generator=gen).to(device)
    bias = torch.randn(experts, n_cols, generator=gen).to(device, dtype)
    lora_x = torch.randn(rows, rank, generator=gen).to(device, dtype)
    lora_w = torch.randn(experts, rank, n_cols, generator=gen).to(device, dtype)
    ends = _group_ends(counts, device)
    kwargs = dict(
        gather=gather, scatter=scatter, row_scale=row_scale, bias=bias, lora_x=lora_x, lora_w=lora_w, lora_scale=0.5
    )
    got = grouped_gemm_forward(x, w, ends, num_rows=rows, **kwargs)
    ref = grouped_gemm_reference(x, w, ends, **kwargs)
    assert got.shape == (rows, n_cols) and got.dtype == dtype
    err = _rel_err(got, ref)
    assert err <= TOLERANCE[dtype], f"forward off by {err:.3g} (relative) > {TOLERANCE[dtype]} for {counts} in {dtype}"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=lambda d: str(d).removeprefix("torch."))
def test_forward_plain_rows_without_options(device, dtype):
    """No gather, scatter, bias or LoRA: the (E, K, N) contiguous layout of gpt-oss."""
    _require(device)
    counts = [3, 0, 17, 2, 0]
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(sum(counts), 48, generator=gen).to(device, dtype)
    w = torch.randn(len(counts), 48, 19, generator=gen).to(device, dtype)
    ends = _group_ends(counts, device)
    err = _rel_err(grouped_gemm_forward(x, w, ends), grouped_gemm_reference(x, w, ends))
    assert err <= TOLERANCE[dtype], f"forward off by {err:.3g} (relative) in {dtype}"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=lambda d: str(d).removeprefix("torch."))
@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda layout: layout[0])
def test_wgrad_matches_reference_and_zeroes_empty_experts(device, dtype, layout):
    _require(device)
    _, counts = layout
    gen = torch.Generator().manual_seed(7 + len(counts))
    rows, tokens = sum(counts), 13
    p = torch.randn(rows, 37, generator=gen).to(device, dtype)
    q = torch.randn(tokens, 21, generator=gen).to(device, dtype)
    gather_q = torch.randint(0, tokens, (rows,), generator=gen).to(device)
    ends = _group_ends(counts, device)
    got = grouped_gemm_wgrad(p, q, ends, gather_q=gather_q)
    ref = grouped_gemm_wgrad_reference(p, q, ends, gather_q=gather_q)
    err = _rel_err(got, ref)
    assert err <= TOLERANCE[dtype], f"wgrad off by {err:.3g} (relative) for {counts} in {dtype}"
    for e, n in enumerate(counts):
        if n == 0:
            assert got[e].abs().max().item() == 0, f"expert {e} has no rows but got a nonzero gradient"


@pytest.mark.parametrize("device", DEVICES)
def test_wgrad_gathers_the_left_operand(device):
    _require(device)
    counts = [4, 0, 6]
    gen = torch.Generator().manual_seed(3)
    p = torch.randn(5, 24, generator=gen).to(device)
    q = torch.randn(sum(counts), 16, generator=gen).to(device)
    gather_p = torch.randint(0, 5, (sum(counts),), generator=gen).to(device)
    ends = _group_ends(counts, device)
    err = _rel_err(
        grouped_gemm_wgrad(p, q, ends, gather_p=gather_p), grouped_gemm_wgrad_reference(p, q, ends, gather_p=gather_p)
    )
    assert err <= TOLERANCE[torch.float32], f"wgrad with gathered p off by {err:.3g}"


@pytest.mark.gpu
def test_tuned_config_is_cached_on_disk(tmp_path, monkeypatch):
    """The first call with a new shape times candidate configs; told a folder (as Hone's core does with its user
    cache), the kernels write them there, and a later process reads them back instead of timing again."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from hone.kernels.moe.grouped_gemm import tuning

    timed = []
    time_ms = tuning._time_ms

    def counted(launch, cfg):
        timed.append(cfg)
        return time_ms(launch, cfg)

    def fresh_process():
        monkeypatch.setattr(tuning, "_memory", {})
        monkeypatch.setattr(tuning, "_recent", {})
        monkeypatch.setattr(tuning, "_disk_loaded", set())
        timed.clear()

    monkeypatch.setenv("HONE_TRITON_AUTOTUNE", "1")
    monkeypatch.setenv("HONE_CACHE", str(tmp_path))  # the kernels do not read it: only core names their folder
    monkeypatch.setattr(tuning, "_time_ms", counted)
    monkeypatch.setattr(tuning, "_cache_dir", None)
    fresh_process()
    counts = [300, 0, 212]
    x = torch.randn(sum(counts), 256, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(3, 256, 384, device="cuda", dtype=torch.bfloat16)
    ends = _group_ends(counts, "cuda")
    reference = grouped_gemm_reference(x, w, ends)
    grouped_gemm_forward(x, w, ends)
    assert timed, "a new shape was not timed"
    assert not list(tmp_path.rglob("*.json")), "tuned configs were written though no folder was named"

    folder = tmp_path / "triton"
    tuning.set_cache_dir(folder)
    fresh_process()
    out = grouped_gemm_forward(x, w, ends)
    err = _rel_err(out, reference)
    assert err <= TOLERANCE[torch.bfloat16], f"tuned forward off by {err:.3g}"
    cache = folder / tuning.CACHE_FILE
    assert timed and cache.exists(), f"no tuning cache written at {cache}"
    saved = json.loads(cache.read_text(encoding="utf-8"))
    assert any(key.startswith("forward|") for key in saved)

    fresh_process()  # a later run, told the same folder
    out = grouped_gemm_forward(x, w, ends)
    assert not timed, "the configs on disk were timed again"
    assert _rel_err(out, reference) <= TOLERANCE[torch.bfloat16]


def test_repeated_config_lookups_are_answered_from_recent_calls(monkeypatch):
    """A layer asks for its config hundreds of times a step: only the first ask of a key builds the string key and
    looks it up (or tunes); the memo is dropped when it grows past its limit (batch lengths vary)."""
    from hone.kernels.moe.grouped_gemm import tuning

    asked = []

    def slow_path(kind, device, dtype, rows, n, k, flags, launch):
        asked.append(rows)
        return tuning.heuristic(kind, rows, n, k)

    monkeypatch.setattr(tuning, "_recent", {})
    monkeypatch.setattr(tuning, "_RECENT_LIMIT", 2)
    monkeypatch.setattr(tuning, "_pick_config", slow_path)
    cuda, flags = torch.device("cuda"), (False,) * 5  # only the device's type is read on this path

    def pick(rows):
        return tuning.pick_config("forward", cuda, torch.bfloat16, rows, 384, 256, flags, None, False)

    assert pick(512) is pick(512) and asked == [512]
    pick(1024)
    pick(2048)  # the memo was full: it starts again with this key
    pick(512)
    assert asked == [512, 1024, 2048, 512]
