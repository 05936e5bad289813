"""A run on the CPU, before it starts: the system memory it may take (`detect_system_memory`), this CPU's matmul rate
(`measure_matmul_rate`, measured once per process), the tokens of one pass over the training data (`epoch_tokens`)
and the run's time from them (`estimate_run_time` -> TimeEstimate).

Importing this loads nothing heavy: the probe loads torch, counting the data's tokens loads the tokenizer.
"""

from __future__ import annotations

import json
import os

from hone.core.config import RunConfig
from hone.core.memory.run_plan import detect_system_memory
from hone.core.memory.time_estimate import TimeEstimate, estimate_run_time, measure_matmul_rate

__all__ = ["TimeEstimate", "detect_system_memory", "epoch_tokens", "estimate_run_time", "measure_matmul_rate"]

# Tokens per epoch already counted in this process, by model, data settings and the data files' versions: the
# Train page asks again after every edit, and reading and tokenizing every row is not free.
_COUNTED: dict[str, int] = {}


def epoch_tokens(config: RunConfig) -> int:
    """Tokens of one pass over the training data of a supervised run, tokenized with the model's tokenizer as the
    run will (kept rows, truncated to data.max_length). Reads every row: meant for a background process.

    Raises:
        ModelError, ConfigError, SourceError: the tokenizer or the data cannot be read (the message says what).
    """
    from hone.core.data import check_data
    from hone.core.models.load import tokenizer_for

    data = config.to_dict()["data"]
    versions = [os.stat(entry).st_mtime_ns if os.path.exists(entry) else None for entry in config.data.train]
    key = json.dumps([config.to_dict()["model"], data, versions], sort_keys=True, default=str)
    if key not in _COUNTED:
        report, _ = check_data(config.data, tokenizer_for(config.model), split="train")
        _COUNTED[key] = int(report.tokens)
    return _COUNTED[key]
