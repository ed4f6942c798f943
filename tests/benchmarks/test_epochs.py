"""``benchmarks/epochs.py --smoke`` keeps working: every configuration runs every epoch and
yields finite figures (no speed is asserted: the run is far too small)."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
RUN_TIMEOUT_S = 300


@pytest.mark.slow
@pytest.mark.timeout(RUN_TIMEOUT_S + 60)
def test_the_epochs_benchmark_times_every_epoch_of_every_configuration(tmp_path: Path) -> None:
    out = tmp_path / "epochs.json"
    cmd = [
        sys.executable,
        "-m",
        "benchmarks.epochs",
        "--smoke",
        "--json",
        str(out),
        "--data-dir",
        str(tmp_path / "data"),
        "--s3-dir",
        str(tmp_path / "s3"),
    ]
    # A session of its own: on timeout the whole group (server and proxy too) is ended.
    proc = subprocess.Popen(
        cmd,
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        output, _ = proc.communicate(timeout=RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        pytest.fail(f"smoke run exceeded {RUN_TIMEOUT_S} s; output tail:\n{output[-4000:]}")
    assert proc.returncode == 0, output[-4000:]
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
        for epoch in row["epochs"]:
            assert epoch["images"] == row["images"]  # whole epochs, every image
            assert math.isfinite(epoch["images_per_s"]) and epoch["images_per_s"] > 0
            assert 0 < epoch["first_batch_s"] < epoch["seconds"]
    assert {c["persistent"] for c in results["comparisons"]} == {False, True}
    for comparison in results["comparisons"]:
        assert math.isfinite(comparison["ratio"]) and comparison["ratio"] > 0
    assert "S3 / local" in output
