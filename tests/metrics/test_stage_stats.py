"""StageStats (one process's counters and histograms) and SharedStats (their shared-memory
rows, summed by the main process)."""

from __future__ import annotations

import pickle
import threading

import pytest

from concurrent_loader.errors import Reason, ServerError
from concurrent_loader.metrics import SharedStats, StageStats
from concurrent_loader.metrics.stats import BUCKETS, COUNTERS, EDGES, HISTOGRAMS


def counters(stats: StageStats) -> dict[str, float]:
    return dict(zip(COUNTERS, stats.vector(), strict=False))


def test_starts_at_zero():
    stats = StageStats()
    assert set(counters(stats).values()) == {0.0}
    for name in HISTOGRAMS:
        histogram = stats.histogram(name)
        assert histogram["count"] == histogram["total"] == 0
        assert len(histogram["counts"]) == BUCKETS


def test_a_response_counts_one_object_its_bytes_and_its_latencies():
    stats = StageStats()
    stats.on_response(0.002, 1000, 0.001)
    stats.on_response(0.004, 24, None)
    assert counters(stats)["objects"] == 2 and counters(stats)["bytes"] == 1024
    fetch = stats.histogram("fetch")
    assert fetch["count"] == 2 and fetch["total"] == pytest.approx(0.006)
    assert sum(fetch["counts"]) == 2
    first_byte = stats.histogram("first_byte")
    assert first_byte["count"] == 1 and first_byte["total"] == pytest.approx(0.001)


@pytest.mark.parametrize("seconds", [0.0, 1e-6, 3e-5, 0.002, 0.5, 7.0, 999.0, 5000.0])
def test_a_latency_lands_in_the_bucket_whose_upper_edge_bounds_it(seconds):
    stats = StageStats()
    stats.add_decode(seconds)
    counts = stats.histogram("decode")["counts"]
    (bucket,) = [i for i, c in enumerate(counts) if c]
    if bucket < BUCKETS - 1:
        assert seconds <= EDGES[bucket] * (1 + 1e-9)
    if bucket > 0:
        assert seconds > EDGES[bucket - 1] * (1 - 1e-9)


def test_retries_throttles_and_counters():
    stats = StageStats()
    stats.on_retry(ServerError("x", url="memory://t/a", cause=Reason.SERVER_ERROR))
    stats.on_throttle()
    stats.add("skipped", 3)
    stats.set("inflight", 7)
    stats.set("inflight", 5)
    assert counters(stats) == {
        "objects": 0,
        "bytes": 0,
        "retries": 1,
        "throttles": 1,
        "skipped": 3,
        "inflight": 5,
        "inflight_limit": 0,
        "decode_threads": 0,
        "hedges": 0,
        "hedges_won": 0,
        "cache_hits": 0,
        "cache_misses": 0,
        "cache_bytes": 0,
    }


def test_counts_from_many_threads_are_not_lost():
    stats = StageStats()

    def work() -> None:
        for _ in range(2000):
            stats.on_response(0.001, 1, None)
            stats.add("retries")

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert counters(stats)["objects"] == counters(stats)["retries"] == 8000
    assert stats.histogram("fetch")["count"] == 8000


def test_pickles_and_rebuilds_from_its_vector():
    stats = StageStats()
    stats.on_response(0.01, 10, 0.005)
    stats.add_decode(0.2)
    assert pickle.loads(pickle.dumps(stats)).vector() == stats.vector()
    assert StageStats(stats.vector()).vector() == stats.vector()


def test_shared_rows_sum_over_processes():
    shared = SharedStats(num_workers=2)
    main, worker = StageStats(), StageStats()
    main.on_response(0.001, 100, None)
    worker.on_response(0.01, 50, 0.004)
    worker.on_response(0.01, 50, None)
    worker.add("retries", 2)
    worker.add_decode(0.003)
    shared.write(0, main)
    shared.write(2, worker)
    total = shared.total()
    assert total["objects"] == 3 and total["bytes"] == 200 and total["retries"] == 2
    assert total["fetch"]["count"] == 3
    assert total["fetch"]["total"] == pytest.approx(0.021)
    assert total["decode"]["count"] == 1 and total["first_byte"]["count"] == 1
    # a row is replaced, not added to: each process writes its running totals
    worker.on_response(0.01, 50, None)
    shared.write(2, worker)
    assert shared.total()["objects"] == 4


def test_a_row_read_back_continues_counting():
    shared = SharedStats(num_workers=1)
    stats = StageStats()
    stats.add("skipped")
    shared.write(1, stats)
    again = shared.read(1)
    again.add("skipped")
    assert counters(again)["skipped"] == 2


def test_rows_live_in_shared_memory():
    shared = SharedStats(num_workers=3)
    assert shared.rows.is_shared()
    assert shared.rows.shape[0] == 4
