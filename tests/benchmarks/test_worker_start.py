"""``benchmarks/worker_start.py`` keeps working: every start method yields its figures."""

from __future__ import annotations

import math

from benchmarks.worker_start import CONTEXTS, format_table, measure, summarize


def test_worker_start_benchmark_measures_every_start_method(tmp_path, s3_server, s3_bucket, s3_env):
    (tmp_path / "a.bin").write_bytes(b"a" * 64)
    s3_server.upload_dir(tmp_path, s3_bucket, prefix="worker-start-smoke/")
    url = f"s3://{s3_bucket}/worker-start-smoke/"
    starts = measure(url, ["a.bin"], workers=1, repeats=1)
    assert sorted(s.context for s in starts) == sorted(CONTEXTS)
    for start in starts:
        assert 0 < start.first_get_s < 120 and math.isfinite(start.first_get_s)
        assert start.uss_mb > 0 and start.rss_mb >= start.uss_mb
        # A plain-http endpoint, credentials resolved in the main process: no TLS set up.
        assert start.ssl_contexts == 0
    assert "fork" in format_table(summarize(starts))
