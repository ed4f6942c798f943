"""``benchmarks/presize.py --smoke`` keeps working: every configuration runs every epoch of
every repeat, and the report has each row, each ratio and each form's bytes per sample
(no speed is asserted: the run is far too small). The cached runs are all hits."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from _benchmark_run import run_benchmark

RUN_TIMEOUT_S = 300


def _finite(value: object) -> bool:
    return isinstance(value, int | float) and math.isfinite(value) and value > 0


@pytest.mark.slow
@pytest.mark.timeout(RUN_TIMEOUT_S + 60)
def test_the_presize_benchmark_reports_every_row_ratio_and_form(tmp_path: Path) -> None:
    out = tmp_path / "presize.json"
    returncode, output = run_benchmark(
        "benchmarks.presize",
        [
            "--smoke",
            "--json",
            str(out),
            "--data-dir",
            str(tmp_path / "data"),
            "--s3-dir",
            str(tmp_path / "s3"),
            "--cache-root",
            str(tmp_path / "caches"),
        ],
        RUN_TIMEOUT_S,
    )
    assert returncode == 0, output[-4000:]
    report = json.loads(out.read_text())

    rows = {row["config"]: row for row in report["rows"]}
    assert list(rows) == ["stock", "local", "jpeg256", "raw256"]
    for row in rows.values():
        assert len(row["runs"]) == report["repeats"]
        for run in row["runs"]:
            assert [e["epoch"] for e in run["epochs"]] == list(range(report["epochs"]))
            for epoch in run["epochs"]:
                assert epoch["images"] == report["images"]  # whole epochs, every image
                assert epoch["window"] is not None  # a steady-state window in each epoch
        for measure in ("whole_images_per_s", "steady_images_per_s"):
            summary = row[measure]
            assert summary["min"] <= summary["median"] <= summary["max"], (row["config"], measure)
            assert all(_finite(v) for v in summary["values"])
            assert len(summary["values"]) == report["repeats"]
    # Later epochs of a filled cache: every read a hit, no object fetched.
    assert rows["jpeg256"]["cache_misses"] == rows["raw256"]["cache_misses"] == 0
    assert report["timed_runs_object_gets"] == 0

    ratios = {(r["config"], r["against"]): r for r in report["ratios"]}
    assert set(ratios) == {
        ("local", "stock"),
        ("jpeg256", "stock"),
        ("jpeg256", "local"),
        ("raw256", "stock"),
        ("raw256", "local"),
    }
    for (config, against), ratio in ratios.items():
        for measure in ("whole", "steady"):
            figure = ratio[measure]
            assert _finite(figure["ratio"]), (config, against, measure)
            assert len(figure["per_repeat"]) == report["repeats"]
            target = {"jpeg256": 3.0, "raw256": 8.0}.get(config) if against == "stock" else None
            assert figure["target"] == target
            assert figure["met"] is (None if target is None else figure["ratio"] >= target)

    sizes = report["bytes_per_sample"]
    assert set(sizes) == {"original", "jpeg256", "raw256"}
    assert all(_finite(v) for v in sizes.values())
    for config in ("jpeg256", "raw256"):
        assert report["fill"][config]["entries"] == report["images"]
        assert _finite(report["fill"][config]["images_per_s"])

    for text in ("steady state", "target >= 3x", "target >= 8x", "disk bytes per sample"):
        assert text in output
    assert not list((tmp_path / "caches").iterdir())  # the caches are removed


def test_each_repeat_reverses_the_order() -> None:
    from benchmarks.presize import CONFIGS, _order

    assert _order(0) == list(CONFIGS)
    assert _order(1) == list(reversed(CONFIGS))
    assert _order(2) == list(CONFIGS)
