"""``benchmarks.cache`` keeps working: its smoke run reads every image of every epoch (it
checks that itself) and reports finite figures for each row. No speed is asserted; the GET
counts are: a cache holding everything sends none, and half a budget about half (plus
the hedges the loader counted)."""

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
    half = report["half_budget"]
    # Epoch 2 misses exactly what the fill epoch left out, about half the images (the budget
    # is half the bytes); the store sees those GETs plus the hedges the loader sent, no more.
    assert half["epoch2_cache_misses"] == report["images"] - half["entries_after_fill"]
    assert abs(half["epoch2_cache_misses"] - report["images"] / 2) <= 3
    assert half["epoch2_cache_misses"] <= half["epoch2_gets"]
    assert half["epoch2_gets"] <= half["epoch2_cache_misses"] + half["epoch2_hedges"]
    assert "ratio" in cache.format_report(report)
