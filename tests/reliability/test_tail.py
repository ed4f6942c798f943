"""The tail, end to end through the fault proxy in front of a real S3 server: with throttles,
resets, truncated bodies, stalls and stragglers, hedged or not, every sample arrives once,
byte-identical, in the sampler's order; a throttling store is waited out however many
attempts that takes; the time budget ends an object the server never finishes.

These tests assert correctness only, never speed: the machine running them may be loaded.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from concurrent_loader import (
    ConcurrentDataLoader,
    FetchConfig,
    FetchTimeout,
    HedgeConfig,
    ObjectDataset,
    Reason,
    RetryConfig,
    Timeouts,
)
from concurrent_loader.stores import S3Config
from concurrent_loader.testing import FaultPlan

from ._support import sha256_hex

#: 10 % 503 SlowDown, 5 % resets (before and during the body), 2 % truncated bodies, 1 %
#: stalls after the headers
MATRIX = FaultPlan(
    seed=777,
    slowdown_503=0.10,
    reset_before=0.025,
    reset_mid_body=0.025,
    truncate=0.02,
    stall=0.01,
    stall_seconds=30,
)
#: a stall costs one read timeout (1 s) instead of 30 s; with 8 % of GETs failing, eight
#: attempts make an object's failing every one of them (8e-9) unthinkable
CONFIG = FetchConfig(
    timeouts=Timeouts(connect=2, first_byte=2, read=1),
    retry=RetryConfig(max_attempts=8, base_delay=0.01, max_delay=0.2),
)
SAMPLES = 1000
BATCH = 32
SEED = 5


def shuffled(n: int) -> list[int]:
    """The order samples are read in: a seeded permutation, given to the loader as its
    sampler, so that the expected batches do not depend on how a loader draws its seeds."""
    return torch.randperm(n, generator=torch.Generator().manual_seed(SEED)).tolist()


def expected_batches(n: int) -> list[list[int]]:
    order = shuffled(n)
    return [order[i : i + BATCH] for i in range(0, n, BATCH)]


def read_all(small_objects, proxy, config: FetchConfig, n: int = SAMPLES):
    """Every batch of ``n`` objects through ``proxy`` with 2 workers, in a shuffled order;
    returns the batches (lists of sha256 digests) and the loader's stats."""
    ds = ObjectDataset(
        S3Config.from_url(small_objects.url, endpoint_url=proxy.endpoint_url),
        small_objects.keys[:n],
        decode=sha256_hex,
        fetch_config=config,
    )
    loader = ConcurrentDataLoader(ds, batch_size=BATCH, sampler=shuffled(n), num_workers=2)
    return [list(batch) for batch in loader], loader.stats()


def assert_every_sample_once_in_order(batches, small_objects, n: int = SAMPLES) -> None:
    digests = small_objects.digests[:n]
    want = [[digests[i] for i in b] for b in expected_batches(n)]
    assert len(batches) == len(want)
    for position, (got, expected) in enumerate(zip(batches, want, strict=True)):
        assert got == expected, f"batch {position} differs from the sampler's batch"
    flat = [d for b in batches for d in b]
    assert sorted(flat) == sorted(digests)  # each exactly once, none corrupted


@pytest.mark.slow
@pytest.mark.parametrize("hedging", [True, False], ids=["hedged", "not-hedged"])
def test_every_sample_arrives_once_intact_in_order_under_the_fault_matrix(
    hedging, small_objects, s3_env, proxy_factory
):
    proxy = proxy_factory(faults=MATRIX, latency_ms=2, straggler_fraction=0.02, straggler_s=1.0)
    config = dataclasses.replace(CONFIG, hedge=HedgeConfig(enabled=hedging))
    batches, stats = read_all(small_objects, proxy, config)
    assert_every_sample_once_in_order(batches, small_objects)
    faults = proxy.stats()["faults"]
    for name in ("slowdown_503", "reset_before", "reset_mid_body", "truncate", "stall"):
        assert faults.get(name, 0) > 0, f"the proxy never injected {name}: {faults}"
    # each 503 read counted once; a hedge race's cancelled loser may not have read its 503
    assert 0 < stats["throttles"] <= faults["slowdown_503"]
    assert stats["requests"] == SAMPLES  # one response per sample, hedged or not
    if not hedging:
        assert stats["hedges"] == 0


@pytest.mark.slow
def test_hedges_win_over_stragglers_and_every_sample_stays_intact(
    small_objects, s3_env, proxy_factory
):
    # No throttling here (a throttling store is not hedged): 3 % of GETs straggle 2 s, and
    # resets, truncations and stalls hit hedges and the GETs they race alike.
    faults = dataclasses.replace(MATRIX, slowdown_503=0.0)
    proxy = proxy_factory(faults=faults, latency_ms=2, straggler_fraction=0.03, straggler_s=2.0)
    batches, stats = read_all(small_objects, proxy, CONFIG)
    assert_every_sample_once_in_order(batches, small_objects)
    assert stats["hedges"] > 0 and stats["hedges_won"] > 0, stats
    assert stats["hedges_won"] <= stats["hedges"]
    assert stats["requests"] == SAMPLES
    # The budget: at most one hedge per 20 GETs (plus one, and the saved-up burst, per
    # worker process).
    gets = proxy.stats()["requests_by_method"]["GET"]
    assert stats["hedges"] <= 2 * 11 + 0.05 * gets


def test_a_throttling_store_is_waited_out_past_max_attempts(small_objects, s3_env, proxy_factory):
    # Half of all GETs throttled and one attempt allowed: only throttles' not counting as
    # failures lets every sample through.
    proxy = proxy_factory(faults=FaultPlan(seed=11, slowdown_503=0.5))
    config = FetchConfig(
        retry=RetryConfig(max_attempts=1, throttle_base_delay=0.005, throttle_max_delay=0.05)
    )
    n = 200
    batches, stats = read_all(small_objects, proxy, config, n)
    assert_every_sample_once_in_order(batches, small_objects, n)
    # A GET cancelled (the loser of a hedge race) before its 503 was read is not counted,
    # and a throttled hedge whose GET won needs no retry.
    assert 0 < stats["throttles"] <= proxy.stats()["faults"]["slowdown_503"]
    assert 0 < stats["retries"] <= stats["throttles"]


@pytest.mark.parametrize("hedging", [True, False], ids=["hedged", "not-hedged"])
def test_the_time_budget_ends_an_object_whose_server_stalls_after_the_headers(
    hedging, small_objects, s3_env, proxy_factory
):
    # Every GET stalls after its headers for longer than every per-phase timeout allows:
    # only the attempt deadline and the object's budget can end it.
    proxy = proxy_factory(faults=FaultPlan(stall=1.0, stall_seconds=60))
    config = FetchConfig(
        timeouts=Timeouts(connect=30, first_byte=30, read=30, attempt=0.5),
        retry=RetryConfig(max_attempts=10, base_delay=0.0, max_total_seconds=1.2),
        hedge=HedgeConfig(enabled=hedging, min_delay=0.1, max_delay=0.1),
    )
    ds = ObjectDataset(
        S3Config.from_url(small_objects.url, endpoint_url=proxy.endpoint_url),
        small_objects.keys[:1],
        fetch_config=config,
    )
    with pytest.raises(FetchTimeout) as caught:
        next(iter(ConcurrentDataLoader(ds, batch_size=1)))
    assert caught.value.cause is Reason.DEADLINE_EXCEEDED
    assert caught.value.url == ds.url_for(0)
    # Attempts were cut off at 0.5 s and retried at once within the 1.2 s budget.
    assert proxy.stats()["requests_by_method"]["GET"] >= 2


@pytest.mark.slow
def test_a_slowdown_storm_with_the_default_settings_loses_and_fails_nothing(
    small_objects, s3_env, proxy_factory
):
    # Every GET is answered 503 SlowDown for the first 1.5 s after the first GET.
    proxy = proxy_factory(faults=FaultPlan(seed=3, storm_seconds=1.5), latency_ms=5)
    n = 400
    batches, stats = read_all(small_objects, proxy, FetchConfig(), n)
    assert_every_sample_once_in_order(batches, small_objects, n)
    proxy_stats = proxy.stats()
    assert proxy_stats["storm_503"] > 0, "the storm missed the epoch"
    # Each 503 read is counted once (a GET cancelled before its 503 was read is not).
    assert 0 < stats["throttles"] <= proxy_stats["faults"]["slowdown_503"]
    assert stats["requests"] == n
