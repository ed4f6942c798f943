"""``benchmarks/epochs.py --smoke`` keeps working: every configuration runs every epoch and
yields finite figures (no speed is asserted: the run is far too small)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from _benchmark_run import run_benchmark

RUN_TIMEOUT_S = 300


@pytest.mark.slow
@pytest.mark.timeout(RUN_TIMEOUT_S + 60)
def test_the_epochs_benchmark_times_every_epoch_of_every_configuration(tmp_path: Path) -> None:
    out = tmp_path / "epochs.json"
    returncode, output = run_benchmark(
        "benchmarks.epochs",
        [
            "--smoke",
            "--json",
            str(out),
            "--data-dir",
            str(tmp_path / "data"),
            "--s3-dir",
            str(tmp_path / "s3"),
        ],
        RUN_TIMEOUT_S,
    )
    assert returncode == 0, output[-4000:]
    results = json.loads(out.read_text())
    rows = results["rows"]
    assert {(r["storage"], r["persistent"]) for r in rows} == {
        ("s3", False),
        ("local", False),
        ("s3", True),
        ("local", True),
    }
    for row in rows:
        assert len(row["epochs"]) == 2
        assert [e["epoch"] for e in row["epochs"]] == [0, 1]
        assert row["first_epoch_first_batch_s"] == [row["epochs"][0]["first_batch_s"]]
        for epoch in row["epochs"]:
            assert epoch["images"] == row["images"]  # whole epochs, every image
            assert math.isfinite(epoch["images_per_s"]) and epoch["images_per_s"] > 0
            assert 0 < epoch["first_batch_s"] < epoch["seconds"]
            # Where the CPU went. Workers that end with the epoch are counted once reaped,
            # to the microsecond; live (persistent) ones in clock ticks, which a tiny epoch
            # may not reach.
            assert epoch["main_cpu_ms"] > 0 and epoch["main_faults"] > 0
            if not row["persistent"]:
                assert epoch["workers_cpu_ms"] > 0 and epoch["workers_faults"] > 0
            assert 0 < epoch["fault_us"] < 1000
    assert {c["persistent"] for c in results["comparisons"]} == {False, True}
    for comparison in results["comparisons"]:
        assert math.isfinite(comparison["ratio"]) and comparison["ratio"] > 0
        assert math.isfinite(comparison["first_epoch_first_batch_extra_ms"])
        assert comparison["ratio_per_repeat"] == [pytest.approx(comparison["ratio"])]
        for key in ("main_cpu_ms", "workers_cpu_ms", "main_faults", "workers_faults"):
            assert math.isfinite(comparison[f"{key}_extra"])
    assert "S3 / local" in output
    assert "minor faults, workers" in output


def test_each_repeat_swaps_which_storage_runs_first() -> None:
    from benchmarks.epochs import CONFIGS, _order

    assert _order(0) == list(CONFIGS)
    assert _order(1) == [("local", False), ("s3", False), ("local", True), ("s3", True)]
    assert _order(2) == list(CONFIGS)
