"""``benchmarks.analyze`` keeps working: its smoke run analyses the dataset at every latency,
runs the loader with the recommended settings, and reports finite predicted and measured
figures for each. No accuracy is asserted (a smoke run is far too short); the predicted
stall is the model's for the step the run used."""

from __future__ import annotations

import math

import pytest

from benchmarks import analyze
from concurrent_loader.metrics.predict import stall_share


@pytest.mark.slow
def test_the_analyze_benchmark_smoke_run_reports_every_latency(tmp_path):
    report = analyze.run(smoke=True, data_dir=tmp_path)
    assert set(report["latencies"]) == {"0", "50", "200"}
    for row in report["latencies"].values():
        for key in ("predicted_img_s", "measured_img_s", "predicted_stall", "measured_stall"):
            assert math.isfinite(row[key]), (key, row)
        assert row["predicted_img_s"] > 0 and row["measured_img_s"] > 0
        assert 0 <= row["measured_stall"] <= 1
        assert row["predicted_stall"] == pytest.approx(
            stall_share(row["predicted_img_s"], row["step_img_s"])
        )
        assert "workers x" in row["setting"]
    text = analyze.format_report(report)
    assert text.count("predicted") == len(report["latencies"]) * 2
