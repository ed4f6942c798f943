"""``benchmarks/autotune.py --smoke`` keeps working: its one tiny cell runs every setting in
a pinned process and reports finite figures and the tuned choices (no speed is asserted)."""

from __future__ import annotations

import math
import os

import pytest

from benchmarks import autotune


@pytest.mark.slow
def test_the_autotune_benchmark_smoke_run_reports_its_cell(tmp_path):
    cpus = os.sched_getaffinity(0)
    report = autotune.run(smoke=True, data_dir=tmp_path)
    assert os.sched_getaffinity(0) == cpus  # the server's pinning is not this process's
    ((name, cell),) = report["cells"].items()
    assert name == "20k, +0 ms, step half, 1 cores"
    assert set(cell["images_per_s"]) == {"1w 1t 64", "1w auto", "all auto"}
    assert all(math.isfinite(v) and v > 0 for v in cell["images_per_s"].values())
    assert math.isfinite(cell["auto / best"]) and math.isfinite(cell["all auto / best"])
    tuning = cell["auto tuning"]["1w auto"]
    assert tuning["max_decode_threads"] == 1  # one core: the share of one worker
    assert cell["auto tuning"]["all auto"]["max_decode_threads"] == 1  # one worker, one core
    assert "1w auto" in autotune.format_report(report)
