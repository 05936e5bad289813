"""`python -m hone.core.cli` (and `torchrun -m hone.core.cli`): the `hone` command."""

import sys

from hone.core.cli import main

sys.exit(main())
