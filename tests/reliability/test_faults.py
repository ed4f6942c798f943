"""Faults injected between the loader and a real S3 server: nothing is lost, duplicated,
reordered or corrupted, retries stay bounded, throttling lowers the load, and errors that
cannot succeed on a retry are not retried."""

from __future__ import annotations

import asyncio
import random
import time

import pytest
import torch

from concurrent_loader import (
    AccessDenied,
    BucketNotFound,
    ConcurrentDataLoader,
    FetchConfig,
    FetchTimeout,
    HedgeConfig,
    IntegrityError,
    ObjectDataset,
    ObjectNotFound,
    ObjectTooLarge,
    Reason,
    RetryConfig,
    ServerError,
    Throttled,
    Timeouts,
)
from concurrent_loader.fetch import FetchClient
from concurrent_loader.stores import S3Config
from concurrent_loader.testing import FaultPlan

from ._support import expected_batches, sha256_hex

FAULTS = FaultPlan(
    seed=4242,
    slowdown_503=0.10,
    reset_before=0.03,
    reset_mid_body=0.02,
    truncate=0.02,
    stall=0.01,
    stall_seconds=30,
)
INJECTED = ("slowdown_503", "reset_before", "reset_mid_body", "truncate", "stall")
SHUFFLE_SEED = 99


@pytest.mark.slow
def test_every_sample_arrives_once_intact_in_sampler_order_under_faults(
    small_objects, s3_env, proxy_factory
):
    proxy = proxy_factory(faults=FAULTS)
    config = FetchConfig(
        timeouts=Timeouts(connect=2, first_byte=2, read=1),
        retry=RetryConfig(max_attempts=8, base_delay=0.01, max_delay=0.2),
    )
    ds = ObjectDataset(
        S3Config.from_url(small_objects.url, endpoint_url=proxy.endpoint_url),
        small_objects.keys,
        decode=sha256_hex,
        fetch_config=config,
    )
    assert len(ds) >= 2000
    loader = ConcurrentDataLoader(
        ds,
        batch_size=32,
        shuffle=True,
        num_workers=2,
        generator=torch.Generator().manual_seed(SHUFFLE_SEED),
    )

    started = time.monotonic()
    batches = [list(batch) for batch in loader]
    elapsed = time.monotonic() - started

    digests = small_objects.digests
    want = [[digests[i] for i in b] for b in expected_batches(len(ds), 32, SHUFFLE_SEED)]
    # Same batches, same order, same bytes: a lost, duplicated, reordered or corrupted
    # (e.g. truncated then accepted) sample changes at least one digest or position.
    assert len(batches) == len(want)
    for position, (got, expected) in enumerate(zip(batches, want, strict=True)):
        assert got == expected, f"batch {position} differs from the sampler's batch"
    flat = [d for b in batches for d in b]
    assert len(flat) == len(ds)
    assert sorted(flat) == sorted(digests)
    # Stalls cost one read timeout (1 s) each and retries back off at most 0.2 s: a loader
    # that waited out the 30 s stalls, or retried without bound, would not finish in time.
    assert elapsed < 120, f"reading under faults took {elapsed:.0f} s"

    stats = proxy.stats()
    for name in INJECTED:
        assert stats["faults"][name] > 0, f"the proxy never injected {name}: {stats['faults']}"
    injected = sum(stats["faults"][name] for name in INJECTED)
    gets = stats["requests_by_method"]["GET"]
    # Every object was fetched whole at least once more than it was faulted.
    assert gets >= len(ds) + injected, (gets, len(ds), injected)
    # The loader's own counters saw every 503 (one throttle each) and retried.
    loader_stats = loader.stats()
    # (a hedge race's loser, cancelled before it read its 503, is not counted)
    assert 0 < loader_stats["throttles"] <= stats["faults"]["slowdown_503"]
    assert loader_stats["retries"] >= stats["faults"]["slowdown_503"]


def _throttle_run(proxy, small_objects, *, n: int, warmup_batches: int):
    """Read ``n`` objects with one process; returns (digests, proxy stats taken after the
    first ``warmup_batches`` batches, loader stats)."""
    config = FetchConfig(
        max_inflight_requests=16,
        retry=RetryConfig(max_attempts=30, base_delay=0.002, max_delay=0.02, throttle_cooldown=60),
        hedge=HedgeConfig(enabled=False),  # hedges go beyond the limit: count the limit alone
    )
    ds = ObjectDataset(
        S3Config.from_url(small_objects.url, endpoint_url=proxy.endpoint_url),
        small_objects.keys[:n],
        decode=sha256_hex,
        fetch_config=config,
    )
    loader = ConcurrentDataLoader(ds, batch_size=8, num_workers=0, prefetch_batches=4)
    it = iter(loader)
    got = [list(next(it)) for _ in range(warmup_batches)]
    # From here on max_inflight counts only what is sent after the warm-up.
    proxy.reset_stats()
    got += [list(batch) for batch in it]
    return got, proxy.stats(), loader.stats()


def test_503_slowdown_lowers_requests_in_flight(small_objects, s3_env, proxy_factory):
    n = 48
    want = [small_objects.digests[i : i + 8] for i in range(0, n, 8)]

    # Control: the same read without faults keeps more than half of the 16 allowed GETs in
    # flight, so a low count below is the throttling's doing, not the setup's.
    calm = proxy_factory(latency_ms=40)
    got, calm_stats, calm_loader = _throttle_run(calm, small_objects, n=n, warmup_batches=2)
    assert got == want
    assert calm_loader["throttles"] == 0
    assert calm_stats["max_inflight"] > 8, calm_stats

    slowed = proxy_factory(latency_ms=40, faults=FaultPlan(seed=3, slowdown_503=0.3))
    got, slow_stats, slow_loader = _throttle_run(slowed, small_objects, n=n, warmup_batches=2)
    assert got == want
    assert slow_stats["faults"]["slowdown_503"] > 0, "no 503 after the warm-up"
    # Once per round the limit is cut by half the throttled fraction (about 15 % at 30 %)
    # and the cool-down (60 s) keeps it from growing back: fewer than the 16 allowed.
    assert slow_loader["throttles"] >= 4, slow_loader
    assert slow_stats["max_inflight"] < 16, (
        f"after {slow_loader['throttles']} throttles the loader still had "
        f"{slow_stats['max_inflight']} GETs in flight at once (16 allowed)"
    )


EIGHT_ATTEMPTS = RetryConfig(
    max_attempts=8,
    base_delay=0.001,
    max_delay=0.01,
    throttle_base_delay=0.001,
    throttle_max_delay=0.01,
    max_total_seconds=1.0,
)


@pytest.mark.parametrize(
    "case, error, gets",
    [
        ("missing key", ObjectNotFound, 1),
        ("missing bucket", BucketNotFound, 1),
        ("wrong secret", AccessDenied, 1),
        ("unknown access key", AccessDenied, 1),
        ("too large", ObjectTooLarge, 1),
        # Controls: a retryable failure on every attempt is tried max_attempts times, so
        # the count above would show a retry of a non-retryable error; a throttle is not a
        # failure and is retried past max_attempts, until the time budget is spent (None).
        ("500 every time", ServerError, EIGHT_ATTEMPTS.max_attempts),
        ("503 every time", FetchTimeout, None),
    ],
)
def test_only_retryable_errors_are_retried(
    case, error, gets, small_objects, s3_server, s3_env, proxy_factory
):
    faults = {
        "500 every time": FaultPlan(error_500=1.0),
        "503 every time": FaultPlan(slowdown_503=1.0),
    }.get(case)
    proxy = proxy_factory(faults=faults)
    root, key, kwargs = small_objects.url, small_objects.keys[0], {}
    if case == "missing key":
        key = "no/such/object.bin"
    elif case == "missing bucket":
        root = "s3://no-such-bucket-for-retries/"
    elif case == "wrong secret":
        kwargs = {
            "aws_access_key_id": s3_server.access_key,
            "aws_secret_access_key": "not-the-secret-" + "x" * 25,
        }
    elif case == "unknown access key":
        kwargs = {
            "aws_access_key_id": "CLUNKNOWNKEY00000000",
            "aws_secret_access_key": s3_server.secret_key,
        }
    limit = 100 if case == "too large" else FetchConfig().max_object_bytes
    ds = ObjectDataset(
        S3Config.from_url(root, endpoint_url=proxy.endpoint_url, **kwargs),
        [key],
        fetch_config=FetchConfig(retry=EIGHT_ATTEMPTS, max_object_bytes=limit),
    )
    started = time.monotonic()
    with pytest.raises(error) as info:
        next(iter(ConcurrentDataLoader(ds, batch_size=1)))
    assert time.monotonic() - started < 10
    assert info.value.url == ds.url_for(0)
    sent = proxy.stats()["requests_by_method"].get("GET", 0)
    if gets is None:
        assert info.value.cause is Reason.DEADLINE_EXCEEDED
        assert isinstance(info.value.__cause__, Throttled)
        assert sent > EIGHT_ATTEMPTS.max_attempts
    else:
        assert sent == gets


def test_a_body_corrupted_in_flight_is_an_integrity_error_naming_the_object(
    s3_server, reliability_bucket, s3_env, proxy_factory
):
    """The body is checked piece by piece as it arrives: a byte inverted by the proxy
    (the length kept) is still caught, retried, and in the end named in the error."""
    body = random.Random(5).randbytes(400_000)
    client = s3_server.client()  # boto3's default checksum: CRC32
    try:
        client.put_object(Bucket=reliability_bucket, Key="corrupt/big.bin", Body=body)
    finally:
        client.close()
    fetch = FetchConfig(retry=RetryConfig(max_attempts=6, base_delay=0.01, max_delay=0.02))

    def read(proxy, times: int) -> list[bytes]:
        root = S3Config.from_url(
            f"s3://{reliability_bucket}/corrupt/", endpoint_url=proxy.endpoint_url
        ).resolved()

        async def main() -> list[bytes]:
            fetcher = FetchClient(root.open(fetch), fetch)
            try:
                return [bytes(await fetcher.get("big.bin")) for _ in range(times)]
            finally:
                await fetcher.close()

        return asyncio.run(main())

    always = proxy_factory(faults=FaultPlan(seed=1, corrupt=1.0))
    with pytest.raises(IntegrityError) as caught:
        read(always, 1)
    assert caught.value.url == f"s3://{reliability_bucket}/corrupt/big.bin"
    assert caught.value.cause == Reason.CHECKSUM_MISMATCH
    assert always.stats()["faults"]["corrupt"] == fetch.retry.max_attempts

    # Half the GETs corrupted: each retry gets a fresh check, and every read is the object.
    half = proxy_factory(faults=FaultPlan(seed=7, corrupt=0.5))
    assert read(half, 8) == [body] * 8
    assert half.stats()["faults"]["corrupt"] > 0
