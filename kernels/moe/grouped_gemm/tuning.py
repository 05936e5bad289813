"""Block-size choice for the grouped GEMM kernels: timed once per GPU and shape, kept in a folder the caller names.

The first call with a new (GPU, kernel, dtype, N, K, row bucket, fused options) key times a short list of
candidate configs and keeps the fastest, in memory and, once `set_cache_dir` has named a folder, in
`<folder>/grouped_gemm.json`, so later runs start tuned. Hone's core names its user cache's `triton` folder when it
sets up the MoE backend (`hone.core.speed.moe.choice.configure`). Timing synchronizes the GPU, once per key. Set
`HONE_TRITON_AUTOTUNE=0` to skip timing and use the built-in heuristic.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch


@dataclass(frozen=True)
class KernelConfig:
    block_m: int
    block_n: int
    block_k: int
    num_warps: int = 4
    num_stages: int = 3


# Under Triton's CPU interpreter every program runs in numpy: few large tiles are fastest, warps/stages unused.
INTERPRETER_CONFIG = KernelConfig(32, 32, 32, 1, 1)
CACHE_FILE = "grouped_gemm.json"

_memory: dict[str, KernelConfig] = {}
_disk_loaded: set[str] = set()
# Where tuned configs are kept on disk. Until someone says, nowhere: the kernels cannot know the app's cache folder
# (that is hone.core.resources.cache_root's, with its platform conventions and HONE_CACHE), and a second guess here
# would drift from it. Tuning still happens once per key per process; only the memory across runs is missing.
_cache_dir: str | None = None


def set_cache_dir(folder: str | os.PathLike | None) -> None:
    """Keep tuned configs in `folder`/grouped_gemm.json from now on (created on the first save; configs tuned so far
    are written with it); None keeps them in memory only. Configs already in memory stay in use."""
    global _cache_dir
    _cache_dir = None if folder is None else os.fspath(folder)


def cache_dir() -> str | None:
    """The folder tuned configs are kept in, or None while they stay in memory only (see `set_cache_dir`)."""
    return _cache_dir


def _pow2_at_least(n: int, floor: int = 16) -> int:
    size = floor
    while size < n:
        size *= 2
    return size


def _fit(cfg: KernelConfig, m_cap: int, n_cap: int, k_cap: int) -> KernelConfig:
    """Shrink blocks that exceed the problem (no point in a 128-wide tile for a rank-16 LoRA output)."""
    return KernelConfig(
        min(cfg.block_m, m_cap), min(cfg.block_n, n_cap), min(cfg.block_k, k_cap), cfg.num_warps, cfg.num_stages
    )


def candidates(kind: str, rows: int, n: int, k: int) -> list[KernelConfig]:
    """Configs worth timing. For `forward` the tile is (rows, n) and k is reduced; for `wgrad` the tile is
    (rows=M, n) and the group's rows are reduced (k is the row bucket)."""
    m_cap, n_cap, k_cap = _pow2_at_least(rows), _pow2_at_least(n), _pow2_at_least(k)
    # Shared memory per stage is (BM*BK + BK*BN) * bytes; every list stays under ~100 KB at 3 stages in bf16 so
    # that sm75-sm89 parts (64-100 KB per block) have valid entries, and adds larger tiles Hopper can hold.
    wide = [
        KernelConfig(128, 128, 32, 8, 3),
        KernelConfig(128, 128, 64, 8, 3),
        KernelConfig(128, 64, 64, 4, 3),
        KernelConfig(64, 128, 64, 4, 3),
        KernelConfig(64, 64, 64, 4, 4),
        KernelConfig(128, 256, 64, 8, 3),
        KernelConfig(256, 128, 64, 8, 3),
    ]
    narrow = [
        KernelConfig(64, 32, 64, 4, 3),
        KernelConfig(128, 32, 64, 4, 3),
        KernelConfig(128, 32, 128, 8, 3),
        KernelConfig(32, 32, 128, 4, 3),
        KernelConfig(256, 32, 64, 8, 3),
    ]
    pool = narrow if n <= 32 else wide
    if kind == "wgrad" and rows <= 32:  # a LoRA factor's rank is the output's M: tile across N instead
        pool = [
            KernelConfig(32, 128, 64, 4, 3),
            KernelConfig(32, 64, 128, 4, 3),
            KernelConfig(32, 256, 64, 8, 3),
            KernelConfig(16, 128, 128, 4, 3),
        ]
    seen, out = set(), []
    for cfg in pool:
        fitted = _fit(cfg, m_cap, n_cap, k_cap)
        if fitted not in seen:
            seen.add(fitted)
            out.append(fitted)
    return out


def heuristic(kind: str, rows: int, n: int, k: int) -> KernelConfig:
    """The untimed default: the first candidate, which is valid on every sm75+ GPU."""
    return candidates(kind, rows, n, k)[0]


def _time_ms(launch: Callable[[KernelConfig], None], cfg: KernelConfig) -> float:
    launch(cfg)  # compile and warm up
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    reps = 5  # enough to rank configs whose times differ by >5%; tuning runs once per key per machine
    start.record()
    for _ in range(reps):
        launch(cfg)
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / reps


def _disk_path() -> str | None:
    return None if _cache_dir is None else os.path.join(_cache_dir, CACHE_FILE)


def _load_disk() -> None:
    path = _disk_path()
    if path is None or path in _disk_loaded:
        return
    _disk_loaded.add(path)
    try:
        with open(path, encoding="utf-8") as f:
            for key, value in json.load(f).items():
                _memory.setdefault(key, KernelConfig(**value))
    except (OSError, ValueError, TypeError):
        pass  # no cache yet, or an unreadable one: tune again


def _save_disk() -> None:
    path = _disk_path()
    if path is None:
        return
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), suffix=".tmp")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump({key: asdict(cfg) for key, cfg in sorted(_memory.items())}, f, indent=1)
        os.replace(tmp, path)
    except OSError:
        pass  # a read-only home: keep the tuned configs for this process only


def _row_bucket(rows: int) -> int:
    # Batches vary in length; configs are tuned per power-of-two row count so a new length reuses them.
    return _pow2_at_least(rows, 256)


def pick_config(
    kind: str,
    device: torch.device,
    dtype: torch.dtype,
    rows: int,
    n: int,
    k: int,
    flags: tuple[bool, ...],
    launch: Callable[[KernelConfig], None],
    interpreting: bool,
) -> KernelConfig:
    """The block config for one launch, tuned on first use of its key (see the module docstring).

    Args:
        kind: "forward" or "wgrad".
        rows, n, k: forward: sorted rows S, output columns N, reduction K. wgrad: M, N and the rows S.
        flags: the fused options (they change the compiled kernel, so they are part of the key).
        launch: runs the kernel with a given config (used for timing).
    """
    if interpreting or device.type != "cuda":
        return INTERPRETER_CONFIG
    # Every layer asks with the same few arguments, hundreds of times a step: answer those from a plain tuple
    # lookup before building the string key (a host-bound step feels the microseconds).
    fast_key = (kind, device, dtype, rows, n, k, flags)
    cfg = _recent.get(fast_key)
    if cfg is not None:
        return cfg
    cfg = _pick_config(kind, device, dtype, rows, n, k, flags, launch)
    if len(_recent) >= _RECENT_LIMIT:  # batch lengths vary: keep the lookup small
        _recent.clear()
    _recent[fast_key] = cfg
    return cfg


_recent: dict[tuple, KernelConfig] = {}
_RECENT_LIMIT = 4096


def _pick_config(
    kind: str,
    device: torch.device,
    dtype: torch.dtype,
    rows: int,
    n: int,
    k: int,
    flags: tuple[bool, ...],
    launch: Callable[[KernelConfig], None],
) -> KernelConfig:
    if kind == "wgrad":
        m_dim, n_dim, red = rows, n, k
        shape_key = f"m{m_dim}|n{n_dim}|rows{_row_bucket(red)}"
        pool_args = (m_dim, n_dim, _row_bucket(red))
    else:
        shape_key = f"rows{_row_bucket(rows)}|n{n}|k{k}"
        pool_args = (rows, n, k)
    props = torch.cuda.get_device_properties(device)
    key = (
        f"{kind}|{props.name}|sm{props.major}{props.minor}|{str(dtype).removeprefix('torch.')}|{shape_key}|"
        + "".join("1" if f else "0" for f in flags)
    )
    if key in _memory:
        return _memory[key]
    _load_disk()
    if key in _memory:
        return _memory[key]
    if os.environ.get("HONE_TRITON_AUTOTUNE", "1") == "0":
        cfg = heuristic(kind, *pool_args)
        _memory[key] = cfg
        return cfg
    timed = []
    for cfg in candidates(kind, *pool_args):
        try:
            timed.append((_time_ms(launch, cfg), cfg))
        except Exception:  # a config this GPU cannot hold (shared memory, registers): skip it
            continue
    best = min(timed, key=lambda t: t[0])[1] if timed else heuristic(kind, *pool_args)
    _memory[key] = best
    _save_disk()
    return best
