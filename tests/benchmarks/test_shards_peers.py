"""The shard benchmark keeps working: ``python -m benchmarks.shards_peers --smoke``.

No speed is asserted. The run itself checks correctness and fails otherwise: ours reads the
same samples (keys, labels, bytes) as the ``webdataset`` library reads from the same shards;
every loader yields every sample exactly once; the large object arrives with its bytes
(CRC) in parts and with one GET, under both caps. The test checks that every row that can
run here did, with finite figures, that a peer that cannot is listed with its reason, and
that the servers and proxies the run started are gone.
"""

from __future__ import annotations

import importlib.util
import json
import math

import psutil
import pytest
from _benchmark_run import run_benchmark

RUN_TIMEOUT_S = 300


def _finite(value: object) -> bool:
    return isinstance(value, int | float) and math.isfinite(value)


@pytest.mark.slow
def test_the_smoke_run_checks_every_loader_and_both_caps(tmp_path):
    if importlib.util.find_spec("webdataset") is None:
        pytest.skip("webdataset is not installed: the reference reader of the shards")
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    returncode, output = run_benchmark(
        "benchmarks.shards_peers",
        [
            "--smoke",
            "--out",
            str(tmp_path / "out"),
            "--data-dir",
            str(tmp_path / "data"),
        ],
        RUN_TIMEOUT_S,
    )
    assert returncode == 0, output[-4000:]

    results = json.loads((tmp_path / "out" / "shards_peers.json").read_text())
    peers = results["peers"]
    assert peers["checked_samples"] == 96
    must_run = ["ours-stream", "ours-stream-readahead", "webdataset"]
    may_be_missing = ["litdata", "mosaic-streaming"]
    for name in must_run:
        assert _finite(peers["rows"][name]["images_per_s"]), name
    for name in may_be_missing:
        assert name in peers["rows"] or peers["not_run"].get(name), name
    # Installed means run: only a peer this environment lacks may be missing.
    if importlib.util.find_spec("litdata") is not None:
        assert _finite(peers["rows"]["litdata"]["images_per_s"]), peers["not_run"]
    bandwidth = results["bandwidth"]
    for cap in ("total", "per-connection"):
        for mode in ("parts", "one GET"):
            assert _finite(bandwidth[f"{cap} cap, {mode}"]["mib_per_s"])

    leftover = {p.pid for p in psutil.Process().children(recursive=True)} - before
    assert not leftover, f"processes left running: {leftover}"
