"""``python -m concurrent_loader.testing.proxy``: run the proxy process (see :mod:`.cli`)."""

from __future__ import annotations

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
