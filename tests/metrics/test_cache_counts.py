"""The cache's counters: a pipeline's stats report what the process's cache tally gained
while it ran; ``loader_stats`` derives the hit rate; the verdict names the cache when
storage is the bottleneck (a table)."""

from __future__ import annotations

import pytest

from concurrent_loader.metrics import SharedStats, StageStats, StallLedger, loader_stats, verdict
from concurrent_loader.metrics.stats import COUNTERS, CacheTally, cache_tally


def _counters(stats: StageStats) -> dict[str, float]:
    return dict(zip(COUNTERS, stats.vector(), strict=False))


def test_stats_count_what_the_tally_gains_from_their_start():
    tally = CacheTally()
    tally.hit(100)  # before: not this pipeline's
    stats = StageStats(cache=tally)
    tally.hit(10)
    tally.hit(20)
    tally.miss()
    counters = _counters(stats)
    assert (counters["cache_hits"], counters["cache_misses"], counters["cache_bytes"]) == (2, 1, 30)


def test_a_row_read_back_goes_on_from_what_it_held():
    shared = SharedStats(1)
    first = shared.read(1)
    cache_tally().hit(5)
    shared.write(1, first)
    second = shared.read(1)  # the next epoch's pipeline
    cache_tally().miss()
    shared.write(1, second)
    total = shared.total()
    assert (total["cache_hits"], total["cache_misses"], total["cache_bytes"]) == (1, 1, 5)


def test_loader_stats_give_the_hit_rate_and_none_without_reads():
    shared = SharedStats(0)
    out = loader_stats(shared.total(), StallLedger(), elapsed=1.0, fetch_slots=1, decode_slots=1)
    assert out["cache_hit_rate"] is None and out["cache_hits"] == 0
    stats = StageStats(cache=(tally := CacheTally()))
    for _ in range(3):
        tally.hit(7)
    tally.miss()
    shared.write(0, stats)
    out = loader_stats(shared.total(), StallLedger(), elapsed=1.0, fetch_slots=1, decode_slots=1)
    assert (out["cache_hits"], out["cache_misses"], out["cache_bytes"]) == (3, 1, 21)
    assert out["cache_hit_rate"] == pytest.approx(0.75)


@pytest.mark.parametrize(
    ("fetch_busy", "decode_busy", "hit_rate", "says"),
    [
        # storage-bound without a cache: suggest one
        (0.9, 0.2, None, "cache= the dataset"),
        # storage-bound with a cache that serves little: its budget
        (0.9, 0.2, 0.5, "the cache served 50% of reads: a larger cache budget"),
        (0.9, 0.2, 0.949, "a larger cache budget"),
        # storage-bound although the cache serves nearly everything: name it, no advice
        (0.9, 0.2, 0.95, "the cache served 95% of reads"),
        # decode-bound: the cache is not the point
        (0.2, 0.9, 0.5, "decode:"),
    ],
)
def test_the_verdict_names_the_cache_when_storage_is_the_bottleneck(
    fetch_busy, decode_busy, hit_rate, says
):
    line = verdict(
        wait_share=0.5, fetch_busy=fetch_busy, decode_busy=decode_busy, cache_hit_rate=hit_rate
    )
    assert says in line
    if decode_busy > fetch_busy:
        assert "cache" not in line
    if hit_rate is not None and hit_rate >= 0.95:
        assert "budget" not in line


def test_the_verdict_does_not_mention_the_cache_when_the_loader_keeps_up():
    assert "cache" not in verdict(wait_share=0.05, fetch_busy=1, decode_busy=1, cache_hit_rate=0.1)
