"""A run in a child process, for the Studio: `hone train` started as a process of its own (with `--gpus N` on
several GPUs), its events read back from the run folder as it writes them (hone.core.train.child_run).

Kept apart from the names hone.core.api re-exports: the child is `python -m hone.core.cli`, and the CLI imports
hone.core.api, so re-exporting it there would close an import circle (tests/test_layering.py). Stdlib only.
"""

from __future__ import annotations

from hone.core.train.child_run import train_in_child

__all__ = ["train_in_child"]
