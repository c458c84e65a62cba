"""``python -m omnitrio``: see :mod:`omnitrio.cli`."""

import sys

from omnitrio.cli import main

if __name__ == "__main__":
    sys.exit(main())
