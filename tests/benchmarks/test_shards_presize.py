"""``benchmarks/shards_presize.py --smoke`` keeps working: every form is packed by
``concurrent-loader pack`` and read by every row, each epoch yielding every sample once (the
run checks it and fails otherwise); the report has each row, each ratio and each form's
bytes per sample (no speed is asserted: the run is far too small)."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import psutil
import pytest
from _benchmark_run import run_benchmark

RUN_TIMEOUT_S = 300


def _finite(value: object) -> bool:
    return isinstance(value, int | float) and math.isfinite(value) and value > 0


@pytest.mark.slow
@pytest.mark.timeout(RUN_TIMEOUT_S + 60)
def test_the_shards_presize_benchmark_reports_every_row_ratio_and_form(tmp_path: Path) -> None:
    if importlib.util.find_spec("webdataset") is None:
        pytest.skip("webdataset is not installed: the peer reading the same shards")
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    out = tmp_path / "shards_presize.json"
    returncode, output = run_benchmark(
        "benchmarks.shards_presize",
        ["--smoke", "--json", str(out), "--data-dir", str(tmp_path / "data")],
        RUN_TIMEOUT_S,
    )
    assert returncode == 0, output[-4000:]
    report = json.loads(out.read_text())
    short = report["args"]["short_side"]

    forms = ["full", f"jpeg{short}", f"raw{short}"]
    assert list(report["forms"]) == forms
    for form, packed in report["forms"].items():
        assert packed["shards"] and _finite(packed["bytes_per_sample"]), form
        assert packed["command"].startswith("concurrent-loader pack SRC DEST --image-folder")
    assert f"--resize {short} --format raw" in report["forms"][f"raw{short}"]["command"]

    expected_rows = [f"ours-{f}" for f in forms] + [f"webdataset-{f}" for f in forms[1:]]
    assert list(report["rows"]) == expected_rows
    for name, row in report["rows"].items():
        assert len(row["images_per_s_rounds"]) == report["args"]["rounds"], name
        assert all(_finite(v) for v in row["images_per_s_rounds"]), name
        assert _finite(row["images_per_s"]), name

    ratios = {(r["row"], r["against"]): r for r in report["ratios"]}
    assert set(ratios) == {
        (f"ours-{f}", against) for f in forms[1:] for against in ("ours-full", f"webdataset-{f}")
    }
    for (row, against), ratio in ratios.items():
        mine = report["rows"][row]["images_per_s"]
        assert ratio["ratio"] == pytest.approx(mine / report["rows"][against]["images_per_s"])
        bar = ratio["target"]
        assert ratio["met"] is (
            ratio["ratio"] >= bar if against == "ours-full" else ratio["ratio"] > bar
        )

    for text in ("disk bytes per sample", ">= 3x", "webdataset-"):
        assert text in output
    after = {p.pid for p in psutil.Process().children(recursive=True)}
    assert after <= before  # the servers and proxies the run started are gone
