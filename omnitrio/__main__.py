"""``python -m omnitrio``: see :mod:`omnitrio.cli`."""

import os
import sys

# Before any model library loads OpenMP: idle workers sleep rather than spin, since a spinning worker
# on shared cores takes the time slice another process (or this one's other thread) needed.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from omnitrio.cli import main

if __name__ == "__main__":
    sys.exit(main())
