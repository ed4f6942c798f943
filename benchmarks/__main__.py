"""Entry point for ``python -m benchmarks``."""

from benchmarks.run import main

raise SystemExit(main())
