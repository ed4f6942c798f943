"""``benchmarks.tail`` keeps working: its smoke run reads every sample intact (it checks that
itself) and reports finite figures for each run. No speed is asserted."""

from __future__ import annotations

import math

import pytest

from benchmarks import tail


@pytest.mark.slow
def test_the_tail_benchmark_smoke_run_reports_every_figure():
    report = tail.run(smoke=True)
    assert set(report["runs"]) == {"clean", "faults", "faults, not hedged"}
    for name, figures in report["runs"].items():
        for key, value in figures.items():
            assert isinstance(value, int | float) and math.isfinite(value), (name, key, value)
        assert figures["gets_sent"] >= report["objects"]
    assert report["runs"]["clean"]["faults"] == 0
    assert report["runs"]["faults"]["faults"] > 0
    assert report["runs"]["faults, not hedged"]["hedges"] == 0
    assert all(math.isfinite(r) and r > 0 for r in report["ratios"].values())
    assert "faults / clean" in tail.format_report(report)
