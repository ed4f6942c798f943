"""``concurrent-loader analyze ROOT`` end to end, in-process through ``main()``: on a local
image folder and on the local S3 server behind the latency proxy (with a node cache), each
with a tiny ``--seconds``; the report and the plot are written, every figure is finite, the
stall is the model's for the step given, the recommendation names settings; a root that
cannot be read fails with one line naming it, before any measurement."""

from __future__ import annotations

import json
import math
import time
from typing import Any

import pytest

from concurrent_loader.cli import main
from concurrent_loader.metrics.predict import stall_share

pytestmark = pytest.mark.slow


def _finite_numbers(value: Any) -> list[float]:
    """Every number inside ``value`` (None is allowed: "not measured")."""
    if isinstance(value, dict):
        return [n for v in value.values() for n in _finite_numbers(v)]
    if isinstance(value, list):
        return [n for v in value for n in _finite_numbers(v)]
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return []
    assert isinstance(value, int | float), value
    assert math.isfinite(value), value
    return [float(value)]


def test_a_local_image_folder_gets_a_report_a_plot_and_settings(image_folder, tmp_path, capsys):
    root, files = image_folder
    out = tmp_path / "out"
    batch, step_ms = 8, 50.0
    options = ["--seconds", "2", "--cpus", "2", "--batch-size", str(batch)]
    options += ["--step-ms", str(step_ms), "--out", str(out), "--no-progress"]
    status = main(["analyze", str(root), *options])
    assert status == 0
    printed = capsys.readouterr().out
    report = (out / "report.txt").read_text()
    assert printed.strip() == report.strip()
    assert f"{len(files)} images" in report
    assert "recommend: ConcurrentDataLoader(num_workers=" in report
    assert "decode_threads=" in report
    assert (out / "rate.png").read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    summary = json.loads((out / "analysis.json").read_text())
    assert _finite_numbers(summary)
    assert summary["kind"] == "images" and summary["objects"] == len(files)
    assert {row["workers"] for row in summary["end_to_end"]} == {1, 2}
    assert all(row["measured_per_s"] > 0 for row in summary["end_to_end"])
    rec = summary["recommendation"]
    assert rec["workers"] * rec["decode_threads"] <= 2
    assert rec["max_inflight_requests"] is None  # a local directory sends no requests
    step_rate = batch / (step_ms / 1000)
    assert rec["stall_share"] == pytest.approx(stall_share(rec["predicted_per_s"], step_rate))


def test_s3_behind_the_latency_proxy_with_a_cache_budget(
    image_dataset, s3_env, proxy_factory, capsys
):
    proxy = proxy_factory(latency_ms=20)
    options = ["--seconds", "3", "--cpus", "2", "--batch-size", "8", "--step-rate", "500"]
    options += ["--cache-budget", "10MB", "--json", "--no-progress"]
    status = main(["analyze", image_dataset.s3_url, "--endpoint-url", proxy.endpoint_url, *options])
    assert status == 0
    summary = json.loads(capsys.readouterr().out)
    assert _finite_numbers(summary)
    assert set(summary["ingest"]) == {"8", "64", "256"}
    assert all(row["objects_per_s"] > 0 for row in summary["ingest"].values())
    assert summary["get_latency_s"] > 0
    rec = summary["recommendation"]
    assert rec["max_inflight_requests"] >= 4
    assert rec["stall_share"] == pytest.approx(stall_share(rec["predicted_per_s"], 500.0))
    cache = summary["cache"]
    assert cache["budget_bytes"] == 10_000_000 and cache["hit_rate_per_s"] > 0
    assert cache["budget_share"] == 1.0  # the test dataset is far smaller than 10 MB
    # every GET went to the endpoint given, through the proxy
    assert proxy.stats()["requests_by_method"].get("GET", 0) >= len(image_dataset.files)


@pytest.mark.parametrize("where", ["bucket", "directory"])
def test_a_root_that_cannot_be_read_fails_naming_it_before_measuring(
    where, s3_server, s3_env, tmp_path, capsys
):
    seconds = 60.0
    if where == "bucket":
        root = "s3://no-such-analyze-bucket/train/"
        extra = ["--endpoint-url", s3_server.endpoint_url]
    else:
        root, extra = str(tmp_path / "missing"), []
    started = time.monotonic()
    status = main(["analyze", root, *extra, "--seconds", str(seconds), "--no-progress"])
    elapsed = time.monotonic() - started
    assert status == 1
    error = capsys.readouterr().err
    assert error.startswith("concurrent-loader: error:")
    assert root.rstrip("/") in error
    assert elapsed < seconds  # it never got to the measurements


def test_an_empty_root_is_refused(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert main(["analyze", str(tmp_path / "empty"), "--no-progress"]) == 1
    assert str(tmp_path / "empty") in capsys.readouterr().err


def test_options_that_make_no_sense_are_refused_by_the_parser(tmp_path, capsys):
    with pytest.raises(SystemExit) as exited:
        main(["analyze", str(tmp_path), "--seconds", "0"])
    assert exited.value.code == 2
    assert "--seconds" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["analyze", str(tmp_path), "--step-ms", "10", "--step-rate", "100"])
