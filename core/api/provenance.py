"""What a run was made from (provenance.json in its run folder) and how a rerun compares with it.

`hone train --rerun RUN_DIR` reads the original's first-step loss (`first_step_loss`) and, after the new run's first
step, says whether it matches and which recorded facts differ (`rerun_report`). Stdlib only.
"""

from __future__ import annotations

from hone.core.train.provenance import (
    PROVENANCE_FILE,
    build_provenance,
    first_step_loss,
    read_provenance,
    rerun_differences,
    rerun_report,
)

__all__ = [
    "PROVENANCE_FILE",
    "build_provenance",
    "first_step_loss",
    "read_provenance",
    "rerun_differences",
    "rerun_report",
]
