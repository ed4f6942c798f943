"""``benchmarks.backends`` keeps working on every backend's local server: its smoke run
measures our loader over each (through the latency proxy) and local disk, and the client
CPU per GET of each (and obstore's on the S3 servers), all finite. No speed is asserted."""

from __future__ import annotations

import math
import os

import pytest

from benchmarks import backends
from concurrent_loader.testing import find_azurite


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_backends_benchmark_smoke_run_reports_every_backend(tmp_path):
    if find_azurite() is None:
        pytest.skip("azurite-blob is not installed: run scripts/setup.sh")
    out = tmp_path / "backends.json"
    affinity = os.sched_getaffinity(0)
    report = backends.main(["--smoke", "--data-dir", str(tmp_path / "data"), "--out", str(out)])
    assert os.sched_getaffinity(0) == affinity  # the test process is not left pinned
    assert set(report["steady"]) == {"local", *backends.SERVERS}
    assert set(report["cpu"]) >= set(backends.SERVERS)
    for section in ("steady", "cpu"):
        for name, row in report[section].items():
            assert math.isfinite(row["median"]) and row["median"] > 0, (section, name, row)
    assert out.exists()
