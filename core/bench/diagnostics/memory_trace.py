"""One training step under CUDA's allocator history (`hone bench --memory-trace`): what is alive at its peak.

`trace_step(runner, "cuda")`, after the run's timed steps, records every allocation and free of one more step with
the Python stack that made it (`torch.cuda.memory._record_memory_history`). Replaying those events from the memory
allocated before the step finds the instant of the peak; the blocks alive then are grouped by the innermost frame
in Hone's, transformers' or peft's code ("site"). Memory allocated before the step (weights, optimizer state,
buffers kept across steps) is one line, `before the step`.
"""

from __future__ import annotations

from pathlib import Path

import torch

GIB = 2**30
_LIBRARIES = ("/hone/", "/transformers/", "/peft/", "/bitsandbytes/")
_FRAMES_PER_SITE = 3


def _hone_folders() -> tuple[str, ...]:
    """Where Hone's own modules are: an editable install from a checkout has no "/hone/" in their paths."""
    import hone.core
    import hone.kernels

    folders = [Path(p) for pkg in (hone.core, hone.kernels) for p in pkg.__path__]
    return tuple(f"{folder}/" for folder in folders if folder.is_dir())


def _own(filename: str, hone_folders: tuple[str, ...]) -> bool:
    return any(part in filename for part in _LIBRARIES) or filename.startswith(hone_folders)


def _site(frames: list[dict], hone_folders: tuple[str, ...] = ()) -> str:
    """The innermost frames in our or the libraries' code ('file:line function'), else the innermost frame."""
    own = [f for f in frames if _own(f.get("filename", ""), hone_folders)]
    chosen = (own or frames)[:_FRAMES_PER_SITE]
    if not chosen:
        return "(no Python frame: autograd engine or C++)"
    return " < ".join(f"{f['filename'].rsplit('/', 2)[-1]}:{f.get('line', '?')} {f.get('name', '')}" for f in chosen)


def peak_from_trace(events: list[dict], before_bytes: int, top: int = 25) -> dict:
    """Replay allocator events (oldest first) from `before_bytes` allocated; summarize the blocks alive at the peak.

    Events are dicts with `action` ("alloc", "free_requested", "free_completed", ...), `addr`, `size` and `frames`
    (as `torch.cuda.memory._snapshot()["device_traces"][i]` has them). A block counts as freed at its first free
    event; blocks allocated before the step and freed during it are taken off `before_bytes` then.
    """
    live: dict[int, dict] = {}
    freed_earlier: set[int] = set()  # addresses of blocks from before the step, already counted as freed
    allocated = peak = before_bytes
    peak_live: list[dict] = []
    peak_event: dict | None = None
    for event in events:
        action = event.get("action")
        if action == "alloc":
            live[event["addr"]] = event
            freed_earlier.discard(event["addr"])
            allocated += event["size"]
            if allocated > peak:
                peak, peak_live, peak_event = allocated, list(live.values()), event
        elif action in ("free_requested", "free_completed"):
            if event["addr"] in live:
                allocated -= live.pop(event["addr"])["size"]
                freed_earlier.add(event["addr"])  # its second event (free_completed) must not count again
            elif event["addr"] not in freed_earlier:
                allocated -= event["size"]
                freed_earlier.add(event["addr"])
    sites: dict[str, list[int]] = {}
    folders = _hone_folders()
    for block in peak_live:
        entry = sites.setdefault(_site(block.get("frames", []), folders), [0, 0])
        entry[0] += block["size"]
        entry[1] += 1
    rows = sorted(sites.items(), key=lambda kv: -kv[1][0])
    return {
        "peak_gib": peak / GIB,
        "before_gib": before_bytes / GIB,
        "step_gib_at_peak": (peak - before_bytes) / GIB,
        "peak_allocation": _site(peak_event.get("frames", []), folders) if peak_event else "",
        "sites": [{"where": where, "gib": size / GIB, "blocks": count} for where, (size, count) in rows[:top]],
        "other_gib": sum(size for _, (size, _) in rows[top:]) / GIB,
    }


def trace_step(runner, device: str, *, top: int = 25, max_entries: int = 500_000) -> dict:
    """Run one more optimizer step of a set-up runner with the allocator recording; summarize its peak."""
    if torch.device(device).type != "cuda":
        return {"error": "the allocator history needs a CUDA device"}
    index = torch.device(device).index
    index = torch.cuda.current_device() if index is None else index
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated(index)
    torch.cuda.memory._record_memory_history(max_entries=max_entries, stacks="python")
    try:
        runner.step()
        torch.cuda.synchronize()
        snapshot = torch.cuda.memory._snapshot()
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)
    traces = snapshot.get("device_traces", [])
    events = traces[index] if index < len(traces) else []
    summary = peak_from_trace(events, before, top=top)
    summary["events"] = len(events)
    summary["complete"] = len(events) < max_entries
    return summary


def memory_lines(name: str, summary: dict) -> list[str]:
    """Printable lines of one run's trace."""
    if "error" in summary:
        return [f"memory at the peak of {name}: {summary['error']}"]
    lines = [
        f"memory at the peak of {name}: {summary['peak_gib']:.2f} GiB = {summary['before_gib']:.2f} before the "
        f"step + {summary['step_gib_at_peak']:.2f} made by it; the peak's allocation: "
        f"{summary['peak_allocation']}"
    ]
    lines += [f"  {row['gib']:7.3f} GiB {row['blocks']:5d} blocks  {row['where']}" for row in summary["sites"]]
    if summary.get("other_gib"):
        lines.append(f"  {summary['other_gib']:7.3f} GiB elsewhere")
    return lines
