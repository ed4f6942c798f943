"""``python -m concurrent_loader``: the command line (see :mod:`concurrent_loader.cli`)."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
