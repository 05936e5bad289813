"""Attention alone: one layer's forward + backward on the benchmark's packed batch, transformers' dense-mask SDPA
(mask build included) against Hone's packed backend, and mask builds per layer.

The measurement itself belongs to the packed-attention work (`hone.core.bench.attention.run`); this module hands
it the scenario's attention geometry and the benchmark's own sequence lengths, passing only the arguments that
function accepts, and records "skipped" when this build does not have it.
"""

from __future__ import annotations

import importlib
import inspect
import traceback

from hone.core.bench.batch import TokenBatch
from hone.core.bench.measure import free_memory, is_out_of_memory


def attention_micro(batch: TokenBatch, facts: dict, *, device: str, dtype) -> dict:
    """Run the attention-alone benchmark; returns {"status", "reason", "result", "table"}."""
    try:
        bench = importlib.import_module("hone.core.bench.attention")
    except ImportError:
        return {"status": "skipped", "reason": "hone.core.bench.attention is not in this build"}
    run = getattr(bench, "run", None)
    if run is None:
        return {"status": "skipped", "reason": "hone.core.bench.attention has no run() in this build"}
    wanted = {"tokens": batch.tokens, "seq_lens": list(batch.lengths), "heads": facts["heads"],
              "kv_heads": facts["kv_heads"], "head_dim": facts["head_dim"], "window": facts["sliding_window"],
              "layers": facts["layers"], "device": device, "dtype": dtype}
    accepted = inspect.signature(run).parameters
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in accepted.values())
    kwargs = {k: v for k, v in wanted.items() if takes_any or k in accepted}
    try:
        result = run(**kwargs)
    except Exception as e:
        status = "oom" if is_out_of_memory(e) else "failed"
        out = {"status": status, "reason": f"{type(e).__name__}: {e}"[:500], "details": traceback.format_exc()}
    else:
        formatter = getattr(bench, "format_table", None)
        out = {"status": "ok", "reason": "", "result": result,
               "table": formatter(result) if callable(formatter) else None,
               "ignored_arguments": sorted(set(wanted) - set(kwargs))}
    free_memory(device)
    return out
