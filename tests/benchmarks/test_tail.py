"""``benchmarks.tail`` keeps working: its smoke run reads every sample intact in every
section (it checks that itself) and reports finite figures. No speed is asserted."""

from __future__ import annotations

import math

import pytest

from benchmarks import tail


def _finite(value: object) -> bool:
    return isinstance(value, int | float) and math.isfinite(value)


@pytest.mark.slow
def test_the_tail_benchmark_smoke_run_reports_every_figure():
    report = tail.run(smoke=True)
    runs = report["runs"]
    assert set(runs) == {
        "clean",
        "faults",
        "faults, not hedged",
        "local disk",
        "clean, step",
        "local disk, step",
    }
    for name, figures in runs.items():
        for key, value in figures.items():
            assert value is None or _finite(value), (name, key, value)
        assert figures["samples"] == report["objects"]
        if not name.startswith("local disk"):
            assert figures["gets_sent"] >= report["objects"]
    assert runs["clean"]["faults"] == 0
    assert runs["faults"]["faults"] > 0
    assert runs["faults, not hedged"]["hedges"] == 0
    assert all(_finite(r) and r > 0 for r in report["ratios"].values())
    storm = report["storm"]
    assert storm["samples"] == 3 * report["objects"]  # every pass, every sample
    assert storm["throttles"] > 0  # the storm happened, and was ridden out
    assert storm["storm_start_s"] < storm["storm_end_s"] and storm["rates"]
    (row,) = report["sweep"].values()
    ratios = {"auto / best fixed", "auto, warm / best fixed"}
    assert set(row) == {"4", tail.AUTO, tail.WARM, "rounds", *ratios}
    for name in (tail.AUTO, tail.WARM):
        assert _finite(row[name]) and row["rounds"][name] == [row[name]]
    text = tail.format_report(report)
    for needle in ("faults / clean", "local disk", "storm", "auto/best", "warm/best", "budget"):
        assert needle in text
