"""``loader.stats()``: counts that match what the store was asked, and the verdict's inputs."""

from __future__ import annotations

import pytest

from concurrent_loader import (
    AccessDenied,
    ConcurrentDataLoader,
    ObjectDataset,
    Reason,
    ServerError,
    Throttled,
)
from concurrent_loader.metrics import (
    SharedStats,
    StageStats,
    StallLedger,
    format_stats,
    loader_stats,
)
from concurrent_loader.testing.memory import MemoryConfig

COUNT = 40


def test_stats_of_a_finished_run_match_the_store(helpers):
    objects = helpers.numbered_objects(COUNT, size=lambda i: 100 + 10 * i)
    denied, throttled, failed = (helpers.key_for(i) for i in (3, 17, 30))

    def script(key: str, attempt: int) -> object:
        url = f"memory://test/{key}"
        if key == denied:
            return AccessDenied("no", url=url, cause=Reason.ACCESS_DENIED)
        if key == throttled and attempt == 0:
            return Throttled("slow down", url=url, cause=Reason.THROTTLED)
        if key == failed and attempt == 0:
            return ServerError("boom", url=url, cause=Reason.SERVER_ERROR)
        return 0.001

    store = MemoryConfig(objects, script=script)
    loader = ConcurrentDataLoader(
        ObjectDataset(store, decode=helpers.index_of, fetch_config=helpers.no_backoff()),
        batch_size=5,
        collate_fn=list,
        on_error="skip",
        max_skipped=1,
    )
    assert len(list(loader)) == 8
    stats = loader.stats()
    delivered = [data for key, data in objects.items() if key != denied]
    assert stats["requests"] == len(delivered) == COUNT - 1
    assert stats["bytes"] == sum(len(data) for data in delivered)
    assert (stats["retries"], stats["throttles"], stats["skipped"]) == (2, 1, 1)
    assert store.stats.total == COUNT + 2  # every attempt, the refused one included
    assert stats["batches"] == 8
    assert stats["inflight"] == 0
    assert stats["elapsed_s"] > 0
    assert stats["get_latency_s"]["p50"] is not None
    assert stats["decode_s_per_image"] is not None
    assert set(stats["wait_s_per_batch"]) == {"p50", "p95", "p99"}
    line = format_stats(stats)
    assert "2 retries, 1 throttles, 1 skipped" in line and stats["verdict"] in line


def test_counts_go_on_across_epochs(helpers):
    store = MemoryConfig(helpers.numbered_objects(10))
    dataset = ObjectDataset(store, decode=helpers.index_of, fetch_config=helpers.unhedged())
    loader = ConcurrentDataLoader(dataset, batch_size=5)
    list(loader)
    list(loader)
    stats = loader.stats()
    assert stats["requests"] == store.stats.total == 20
    assert stats["batches"] == 4


def test_stats_before_iterating():
    loader_totals = SharedStats(0).total()
    stats = loader_stats(loader_totals, StallLedger(), elapsed=0.0, fetch_slots=8, decode_slots=2)
    assert stats["requests"] == stats["batches"] == 0
    assert stats["bytes_per_s"] == stats["images_per_s"] == 0.0
    assert stats["decode_s_per_image"] is None
    assert stats["get_latency_s"] == {"p50": None, "p95": None, "p99": None}
    assert stats["verdict"].startswith("training step:")


def test_busy_shares_are_per_allowed_slot():
    shared = SharedStats(0)
    stats = StageStats()
    for _ in range(10):
        stats.on_response(3.2, 100, None)  # 32 s of GETs
        stats.add_decode(0.5)  # 5 s of decoding
    shared.write(0, stats)
    waits = StallLedger()
    waits.record(5.0, 5.0)  # the loop waited half of the time
    out = loader_stats(shared.total(), waits, elapsed=10.0, fetch_slots=4, decode_slots=1)
    # fetch: 32 s / 10 s / 4 slots = 80 % busy; decode: 5 s / 10 s / 1 thread = 50 %
    assert out["verdict"].startswith("storage:") and "80%" in out["verdict"]
    assert out["images_per_s"] == pytest.approx(1.0)
    assert out["bytes_per_s"] == pytest.approx(100.0)
    assert out["decode_s_per_image"] == pytest.approx(0.5)
