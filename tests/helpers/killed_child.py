"""A benchmark peer stand-in that is killed with SIGKILL after touching some memory, as the kernel's out-of-memory
killer ends a process: `python -m tests.helpers.killed_child SPEC RESULT` (it never writes RESULT)."""

import os
import signal
import sys
import time

if __name__ == "__main__":
    print("Loading weights: 100%|██████████| 399/399 [00:01<00:00, 226.52it/s]", file=sys.stderr)
    print("patched 36 layers", file=sys.stderr)
    held = bytearray(256 << 20)  # 256 MiB, touched
    for at in range(0, len(held), 4096):
        held[at] = 1
    sys.stderr.flush()
    time.sleep(1.0)  # long enough for the parent, which looks every 0.2 s, to see the memory held
    os.kill(os.getpid(), signal.SIGKILL)
