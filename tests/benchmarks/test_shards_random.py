"""``benchmarks.shards_random`` keeps working: its smoke run reads every sample in sampler
order with its label (the run checks that itself) and reports finite figures for each run,
plain S3 sends one GET per sample and read-ahead fewer. No speed is asserted."""

from __future__ import annotations

import math

import pytest

from benchmarks import shards_random


@pytest.mark.slow
def test_the_shards_benchmark_smoke_run_reports_every_figure(tmp_path):
    report = shards_random.run(smoke=True, objects=True, data_dir=tmp_path / "data")
    assert set(report["runs"]) == {
        "ours-local",
        "ours-s3",
        "ours-s3 readahead=8MiB/512MiB",
        "objects-local",
        "objects-s3",
    }
    assert report["shards"] > 1
    for name, figures in report["runs"].items():
        for key, value in figures.items():
            values = value if isinstance(value, list) else [value]
            assert all(isinstance(v, float) and math.isfinite(v) for v in values), (name, key)
    runs = report["runs"]
    readahead = runs["ours-s3 readahead=8MiB/512MiB"]["gets_per_sample"]
    assert runs["ours-s3"]["gets_per_sample"] >= 1.0 > readahead
    text = shards_random.format_report(report)
    assert "| ours-s3 |" in text and "objects-s3 / objects-local" in text
