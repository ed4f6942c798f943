"""``benchmarks.listing`` keeps working: its smoke run lists a root larger than one page
(so it is split by prefixes) the same way in parallel and in sequence (the run checks the
keys and their order itself) and reports finite figures. No speed is asserted."""

from __future__ import annotations

import math

import pytest

from benchmarks import listing
from concurrent_loader.listing import FIRST_PAGE_KEYS


@pytest.mark.slow
def test_the_listing_benchmark_smoke_run_reports_every_figure() -> None:
    report = listing.run(smoke=True)
    assert report["keys"] > FIRST_PAGE_KEYS  # more than one page: split by prefixes
    for name in ("parallel_s", "sequential_s", "sequential_own_pages_s", "speedup"):
        assert math.isfinite(report[name]) and report[name] > 0, name
    for name in ("parallel_cpu_s", "sequential_cpu_s", "sequential_own_pages_cpu_s"):
        assert set(report[name]) == {"client", "server", "proxy"}
        assert all(math.isfinite(v) and v >= 0 for v in report[name].values())
