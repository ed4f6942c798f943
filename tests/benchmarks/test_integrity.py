"""``benchmarks.integrity`` keeps working: its smoke run gives a finite CPU figure for every
checksum the loader uses and for zlib's CRC32, at every size, and the fetch client's CPU per
GET with verification on and off against SeaweedFS. No speed is asserted."""

from __future__ import annotations

import math

import pytest

from benchmarks import integrity
from concurrent_loader.stores.checksum import ALGORITHMS


def _finite(value: object) -> bool:
    return isinstance(value, int | float) and math.isfinite(value) and value >= 0


@pytest.mark.slow
def test_the_integrity_benchmark_smoke_run_reports_every_figure(tmp_path):
    report = integrity.run(smoke=True, data_dir=tmp_path)
    rows = report["checksums_us"]
    assert {f"{name} (ours)" for name in ALGORITHMS} | {"crc32 (zlib)"} <= set(rows)
    for label, row in rows.items():
        assert set(row) == {str(size) for size in report["sizes"]}, label
        assert all(_finite(value) for value in row.values()), (label, row)
    fetch = report["fetch"]
    for label in ("off", "on"):
        assert all(_finite(fetch[label][key]) for key in ("us_per_get", "min", "max")), fetch
    assert math.isfinite(fetch["extra_us_per_get"])
    text = integrity.format_report(report)
    assert "crc64nvme (ours)" in text and "verification on" in text
