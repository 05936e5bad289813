"""Attention alone on one packed row: transformers' dense-mask SDPA against Hone's packed backends.

`run` times one attention layer's forward + backward three ways: dense (the (T x T) block mask built from position
ids, as transformers does for a packed row, then SDPA), ours (the backend `hone.core.speed.attention` picks here,
fed the collator's metadata built once per batch) and ours with the metadata rebuilt in every layer. It also counts
mask/metadata builds per layer and checks the paths agree. `run_on_batch` is what `hone bench` records as
"attention alone"; `python -m hone.core.bench.attention_step` runs it from the shell. Runs on a CPU at small sizes.
"""

from __future__ import annotations

import functools
import statistics
import time
import traceback
from collections.abc import Callable

import torch

from hone.core.bench.batch import TokenBatch
from hone.core.bench.measure import free_memory, is_out_of_memory
from hone.core.data.collate import collate_packed
from hone.core.speed.attention import backends, packed_metadata

# Default geometry: Qwen3-0.6B's attention (16 query heads, 8 key/value heads, head dim 128).
DEFAULT_HEADS, DEFAULT_KV_HEADS, DEFAULT_HEAD_DIM = 16, 8, 128
# Default sequence lengths: uniform in [64, 1024] tokens, a spread typical of chat fine-tuning rows.
DEFAULT_MIN_LEN, DEFAULT_MAX_LEN = 64, 1024


class _Row:
    def __init__(self, n: int):
        self.input_ids = [1] * n
        self.labels = [1] * n


class _Layer(torch.nn.Module):
    """The attributes transformers' attention functions read from the attention module."""

    def __init__(self, heads: int, kv_heads: int):
        super().__init__()
        self.num_key_value_groups = heads // kv_heads
        self.is_causal = True


def packed_lengths(tokens: int, seed: int = 0, low: int = DEFAULT_MIN_LEN, high: int = DEFAULT_MAX_LEN) -> list[int]:
    """Random sequence lengths in [low, high] that sum to exactly `tokens` (the last one is cut to fit)."""
    generator = torch.Generator().manual_seed(seed)
    lengths: list[int] = []
    while sum(lengths) < tokens:
        lengths.append(int(torch.randint(low, high + 1, (1,), generator=generator)))
    lengths[-1] -= sum(lengths) - tokens
    return [n for n in lengths if n > 0]


def _timed_ms(fn, device: torch.device, repeats: int, warmup: int) -> float:
    """Median wall time of `fn()` in milliseconds, the GPU drained before and after each run."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append((time.perf_counter() - start) * 1000.0)
    return statistics.median(times)


def _hf_mask_builder(heads: int, kv_heads: int, head_dim: int, window: int | None, dtype, device):
    from transformers import MistralConfig, masking_utils

    config = MistralConfig(
        hidden_size=heads * head_dim,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        sliding_window=window,
        num_hidden_layers=1,
    )
    config._attn_implementation = "sdpa"
    build = masking_utils.create_sliding_window_causal_mask if window else masking_utils.create_causal_mask

    def make(position_ids: torch.Tensor):
        embeds = torch.empty(1, position_ids.shape[1], 1, dtype=dtype, device=device)
        # positional: (config, inputs_embeds, attention_mask, cache, position_ids) on transformers 5.17 and 5.24
        return build(config, embeds, None, None, position_ids)

    return make


def _pick_backend(
    backend: str, device: torch.device, dtype, heads, kv_heads, head_dim, window
) -> tuple[str, str, Callable, Callable]:
    """(name, description, the backend's function, its per-layer-metadata variant) for Hone's side."""
    half = dtype in (torch.bfloat16, torch.float16)
    if backend in ("auto", "varlen") and device.type == "cuda" and half and backends.varlen_available():
        from hone.core.speed.attention import probe_varlen

        probed = probe_varlen(device, dtype, heads, kv_heads, head_dim, [None, window] if window else [None])
        if isinstance(probed, backends.VarlenOptions):
            return (
                "varlen",
                "torch varlen_attn",
                functools.partial(backends.varlen_attention, options=probed),
                functools.partial(backends.varlen_attention_per_layer, options=probed),
            )
        if backend == "varlen":
            raise RuntimeError(probed)
    if backend in ("auto", "flash") and device.type == "cuda" and half and backends.fa2_available():
        return "flash", "flash-attn varlen", backends.fa2_attention, backends.fa2_attention_per_layer
    if backend in ("varlen", "flash"):
        raise RuntimeError(f"backend {backend!r} cannot run on {device} in {dtype}")
    return (
        "sdpa",
        "SDPA with one shared block mask",
        backends.blockmask_attention,
        backends.blockmask_attention_per_layer,
    )


def run(
    tokens: int = 16384,
    *,
    heads: int = DEFAULT_HEADS,
    kv_heads: int = DEFAULT_KV_HEADS,
    head_dim: int = DEFAULT_HEAD_DIM,
    window: int | None = None,
    seq_lens: list[int] | None = None,
    dtype: torch.dtype | None = None,
    device: str | torch.device | None = None,
    backend: str = "auto",
    repeats: int = 10,
    warmup: int = 3,
    seed: int = 0,
    layers: int = 28,
) -> dict:
    """Time one attention layer fwd+bwd on a packed batch: dense-mask SDPA (incl. mask build) vs Hone's backend.

    Args:
        tokens: packed row length T (ignored when `seq_lens` is given).
        heads, kv_heads, head_dim: attention geometry (default: Qwen3-0.6B).
        window: sliding window (None = full causal attention).
        seq_lens: explicit sequence lengths; default: `packed_lengths(tokens, seed)`.
        dtype: default bf16 on CUDA, fp32 on CPU. device: default CUDA when available.
        backend: "auto", "varlen", "flash" or "sdpa" for Hone's side.
        repeats, warmup: timed and untimed runs of each measurement.
        layers: model depth over which mask/metadata builds per layer are counted (default: Qwen3-0.6B's 28).

    Returns:
        A flat dict: sizes, `dense_mask_build_ms`, `dense_sdpa_ms`, `dense_total_ms`, `ours_ms`,
        `ours_per_layer_ms`, `speedup` (dense_total / ours), `metadata_cpu_ms` (the collator, once per batch),
        `mask_builds_per_layer_dense/ours/ours_per_layer`, `max_abs_diff` (ours vs dense output), `backend`.
    """
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    dtype = dtype or (torch.bfloat16 if device.type == "cuda" else torch.float32)
    lengths = seq_lens or packed_lengths(tokens, seed)
    total = sum(lengths)
    name, description, fast, per_layer = _pick_backend(backend, device, dtype, heads, kv_heads, head_dim, window)

    start = time.perf_counter()
    batch = collate_packed([_Row(n) for n in lengths], pin_memory=device.type == "cuda")
    metadata_cpu_ms = (time.perf_counter() - start) * 1000.0
    batch = batch.to(device)
    kwargs = batch.model_inputs()
    layer = _Layer(heads, kv_heads).to(device).train()
    scaling = head_dim**-0.5

    generator = torch.Generator(device="cpu").manual_seed(seed)
    q, k, v = (
        torch.randn(1, h, total, head_dim, generator=generator).to(device, dtype).requires_grad_()
        for h in (heads, kv_heads, kv_heads)
    )
    grad_out = torch.randn(1, total, heads, head_dim, generator=generator).to(device, dtype)
    make_mask = _hf_mask_builder(heads, kv_heads, head_dim, window, dtype, device)

    def fwd_bwd(attend):
        for t in (q, k, v):
            t.grad = None
        out, _ = attend()
        out.backward(grad_out)
        return out

    def dense():
        mask = make_mask(batch.position_ids)
        return sdpa_attention_forward(layer, q, k, v, mask, scaling=scaling, sliding_window=window)

    def ours():
        return fast(
            layer,
            q,
            k,
            v,
            None,
            scaling=scaling,
            sliding_window=window,
            position_ids=batch.position_ids,
            cu_seq_lens_q=kwargs["cu_seq_lens_q"],
            cu_seq_lens_k=kwargs["cu_seq_lens_k"],
            max_length_q=kwargs["max_length_q"],
            max_length_k=kwargs["max_length_k"],
        )

    def ours_per_layer():
        return per_layer(layer, q, k, v, None, scaling=scaling, sliding_window=window, position_ids=batch.position_ids)

    with torch.no_grad():
        reference, _ = dense()
        difference = (ours()[0].float() - reference.float()).abs().max().item()
    del reference

    mask_ms = _timed_ms(lambda: make_mask(batch.position_ids), device, repeats, warmup)
    fixed_mask = make_mask(batch.position_ids)

    def dense_prebuilt():
        return sdpa_attention_forward(layer, q, k, v, fixed_mask, scaling=scaling, sliding_window=window)

    sdpa_ms = _timed_ms(lambda: fwd_bwd(dense_prebuilt), device, repeats, warmup)
    fixed_mask = None  # free the T x T mask before the next measurements
    dense_ms = _timed_ms(lambda: fwd_bwd(dense), device, repeats, warmup)

    counts = {}
    timings = {}
    for label, attend in (("ours", ours), ("ours_per_layer", ours_per_layer)):
        packed_metadata._MASKS.clear()  # count as for a new batch going through a model of `layers` layers
        stats = backends.reset_stats()
        with torch.no_grad():
            for _ in range(layers):
                attend()
        counts[label] = (stats.mask_builds + stats.metadata_builds) / max(stats.packed_calls, 1)
        timings[label] = _timed_ms(lambda a=attend: fwd_bwd(a), device, repeats, warmup)

    return {
        "device": str(device),
        "dtype": str(dtype).replace("torch.", ""),
        "backend": name,
        "backend_description": description,
        "tokens": total,
        "sequences": len(lengths),
        "max_seqlen": max(lengths),
        "heads": heads,
        "kv_heads": kv_heads,
        "head_dim": head_dim,
        "window": window,
        "dense_mask_build_ms": mask_ms,
        "dense_sdpa_ms": sdpa_ms,
        "dense_total_ms": dense_ms,
        "ours_ms": timings["ours"],
        "ours_per_layer_ms": timings["ours_per_layer"],
        "speedup": dense_ms / timings["ours"] if timings["ours"] > 0 else float("inf"),
        "metadata_cpu_ms": metadata_cpu_ms,
        # transformers' SDPA path builds its mask once per forward and shares it over the layers
        "mask_builds_per_layer_dense": 1.0 / layers,
        "mask_builds_per_layer_ours": counts["ours"],
        "mask_builds_per_layer_ours_per_layer": counts["ours_per_layer"],
        "max_abs_diff": difference,
    }


def format_table(result: dict) -> str:
    """A small text table of one `run` result, for the benchmark command's output."""
    lines = [
        f"attention alone, {result['tokens']} tokens in {result['sequences']} sequences (longest "
        f"{result['max_seqlen']}), {result['heads']}/{result['kv_heads']} heads x {result['head_dim']}, "
        f"{result['dtype']} on {result['device']}",
        f"{'path':<42}{'fwd+bwd ms':>12}{'mask builds/layer':>20}",
        f"{'dense-mask SDPA (transformers), mask build':<42}{result['dense_mask_build_ms']:>12.2f}{'':>20}",
        f"{'dense-mask SDPA, attention only':<42}{result['dense_sdpa_ms']:>12.2f}{'':>20}",
        f"{'dense-mask SDPA, total':<42}{result['dense_total_ms']:>12.2f}"
        f"{result['mask_builds_per_layer_dense']:>20.2f}",
        f"{'Hone ' + result['backend'] + ', metadata once per batch':<42}{result['ours_ms']:>12.2f}"
        f"{result['mask_builds_per_layer_ours']:>20.2f}",
        f"{'Hone ' + result['backend'] + ', metadata per layer':<42}{result['ours_per_layer_ms']:>12.2f}"
        f"{result['mask_builds_per_layer_ours_per_layer']:>20.2f}",
        f"speedup vs dense total: {result['speedup']:.2f}x; collator metadata {result['metadata_cpu_ms']:.2f} ms "
        f"on the CPU; max |ours - dense| = {result['max_abs_diff']:.3g}",
    ]
    return "\n".join(lines)


def run_on_batch(batch: TokenBatch, facts: dict, *, device: str, dtype: torch.dtype) -> dict:
    """`run` on `hone bench`'s own sequence lengths with the scenario's attention geometry.

    Args:
        batch: the benchmark's token batch (its lengths are packed into one row).
        facts: `weights.architecture_facts` of the scenario (heads, kv_heads, head_dim, sliding_window, layers).
        device, dtype: where and in what the benchmark runs.

    Returns:
        {"status": "ok", "reason": "", "result": run's dict, "table": format_table's text}, or status "oom" /
        "failed" with the reason and the traceback under "details": a failure here never stops the benchmark.
    """
    try:
        result = run(
            batch.tokens,
            seq_lens=list(batch.lengths),
            heads=facts["heads"],
            kv_heads=facts["kv_heads"],
            head_dim=facts["head_dim"],
            window=facts["sliding_window"],
            layers=facts["layers"],
            device=device,
            dtype=dtype,
        )
    except Exception as e:
        status = "oom" if is_out_of_memory(e) else "failed"
        out = {"status": status, "reason": f"{type(e).__name__}: {e}"[:500], "details": traceback.format_exc()}
    else:
        out = {"status": "ok", "reason": "", "result": result, "table": format_table(result)}
    free_memory(device)
    return out
