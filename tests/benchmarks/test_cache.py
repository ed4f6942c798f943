"""``benchmarks.cache`` keeps working: its smoke run reads every image of every epoch (it
checks that itself) and reports finite figures for each row. No speed is asserted; the GET
counts are: a cache holding everything sends none, and half a budget about half."""

from __future__ import annotations

import math

import pytest

from benchmarks import cache


@pytest.mark.slow
def test_the_cache_benchmark_smoke_run_reports_every_row(tmp_path):
    report = cache.run(smoke=True, data_dir=tmp_path)
    rows = [report["hits_vs_local"], report["half_budget"], *report["bandwidth_cap"].values()]
    for row in rows:
        for key, value in row.items():
            if isinstance(value, list):
                continue
            assert isinstance(value, int | float) and math.isfinite(value), (row, key, value)
    assert report["hits_vs_local"]["cached_gets"] == 0
    assert report["bandwidth_cap"]["200"]["cached_epoch2_gets"] == 0
    assert abs(report["half_budget"]["epoch2_gets"] - report["images"] / 2) <= 3
    assert "ratio" in cache.format_report(report)
