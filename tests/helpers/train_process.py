"""`hone train` as torchrun runs it, with a fault put in for the tests: HONE_TEST_FAIL_RANK raises an error in step
HONE_TEST_FAIL_STEP (how the others react to one failing), or every process waits before step HONE_TEST_HANG_STEP
(so a test can kill the run at a known point however fast its steps are)."""

from __future__ import annotations

import os
import sys
import time

from hone.core.cli import main
from hone.core.train.step import StepRunner

FAIL_RANK, FAIL_STEP = int(os.environ.get("HONE_TEST_FAIL_RANK", -1)), int(os.environ.get("HONE_TEST_FAIL_STEP", 0))
HANG_STEP = int(os.environ.get("HONE_TEST_HANG_STEP", 0))
real_step = StepRunner.step


def faulty_step(self, dataset, packs, step, total, **kwargs):
    if step + 1 == HANG_STEP:
        time.sleep(600)
    if self.world.rank == FAIL_RANK and step + 1 == FAIL_STEP:
        raise RuntimeError(f"process {FAIL_RANK} failed in step {FAIL_STEP} on purpose")
    return real_step(self, dataset, packs, step, total, **kwargs)


if __name__ == "__main__":
    StepRunner.step = faulty_step
    sys.exit(main(sys.argv[1:]))
