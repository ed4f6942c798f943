"""The benchmark harness keeps working: ``python -m benchmarks --smoke`` yields every figure.

No speed is asserted (a smoke run is far too small, and CI machines vary); the test checks
that every configuration and fetch client that can run here did run and produced finite
numbers, that those that cannot are listed with a reason, and that the S3 server and the
proxies the run started are gone when it ends.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import psutil
import pytest
from _benchmark_run import run_benchmark

RUN_TIMEOUT_S = 780

# Everything the project's environment installs must produce figures; LitData may be
# absent (it pins its own torch) but must then be listed with the reason.
MUST_RUN = ("stock-s3", "stock-local", "ours-s3", "ours-local", "s3torchconnector")
MAY_BE_MISSING = ("litdata",)
FETCH_CLIENTS = ("ours", "aiobotocore", "boto3-threads", "obstore")

LOADER_METRICS = (
    "images_per_s",
    "batch_wait_p50_ms",
    "batch_wait_p95_ms",
    "batch_wait_p99_ms",
    "first_batch_s",
    "startup_s",
    "cpu_s_per_1000_images",
    "peak_rss_mb",
    "proxy_cpu_s",
)


def _run_smoke(tmp_path: Path) -> tuple[int, str]:
    returncode, output = run_benchmark(
        "benchmarks",
        [
            "--smoke",
            "--no-progress",
            "--out",
            str(tmp_path / "out"),
            "--data-dir",
            str(tmp_path / "data"),
            "--s3-dir",
            str(tmp_path / "s3"),
        ],
        RUN_TIMEOUT_S,
    )
    return returncode, output


def _finite(value: Any) -> bool:
    return isinstance(value, int | float) and math.isfinite(value)


def _still_running(pid: int, marker: str) -> bool:
    """Whether ``pid`` is still the process the run started (``marker`` in its command)."""
    try:
        proc = psutil.Process(pid)
        return proc.status() != psutil.STATUS_ZOMBIE and marker in " ".join(proc.cmdline())
    except psutil.NoSuchProcess:
        return False


@pytest.mark.slow
@pytest.mark.timeout(RUN_TIMEOUT_S + 60)
def test_smoke_run_reports_every_configuration(tmp_path: Path) -> None:
    returncode, output = _run_smoke(tmp_path)
    assert returncode == 0, output[-4000:]
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    assert (tmp_path / "out" / "results.png").stat().st_size > 0

    assert set(results["configs"]) == {*MUST_RUN, *MAY_BE_MISSING}
    for name, entry in results["configs"].items():
        if name in MAY_BE_MISSING and entry["status"] == "not run":
            assert entry["reason"], entry
            continue
        assert entry["status"] == "ok", (name, entry.get("reason"))
        assert entry["runs"] and all("error" not in r for r in entry["runs"])
        for metric in LOADER_METRICS:
            assert _finite(entry["summary"][metric]["median"]), (name, metric)
        assert entry["summary"]["images_per_s"]["median"] > 0

    for sweep in ("latency", "max_inflight"):
        rows = results["sweeps"][sweep]
        assert rows and all(_finite(r["summary"]["images_per_s"]["median"]) for r in rows)

    concurrencies = [str(c) for c in results["settings"]["fetch_concurrency"]]
    assert set(results["fetch"]) == set(FETCH_CLIENTS)
    for client, entry in results["fetch"].items():
        assert entry["status"] == "ok", (client, entry.get("reason"))
        for c in concurrencies:
            row = entry["by_concurrency"][c]
            assert row["requests"] > 0
            assert _finite(row["requests_per_s"]) and _finite(row["cpu_ms_per_get"])

    assert {t["id"] for t in results["targets"]} == {
        "s3_vs_local",
        "vs_stock",
        "vs_s3torchconnector",
        "fetch_vs_obstore",
        "fetch_cpu",
        "first_batch",
    }

    # The loader under test ran on the client CPUs, its workers included.
    client_cpus = results["cpus"]["client"]
    for entry in results["configs"].values():
        for run in entry["runs"]:
            assert run["affinity"] == client_cpus
            assert all(a == client_cpus for a in run["worker_affinity"])

    servers = results["servers"]
    leftovers = [servers["s3_pid"]] if _still_running(servers["s3_pid"], "weed") else []
    leftovers += [pid for pid in servers["proxy_pids"] if _still_running(pid, "proxy")]
    assert not leftovers, f"server/proxy processes still running: {leftovers}"
