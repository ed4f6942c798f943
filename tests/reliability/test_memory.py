"""Memory and concurrency stay within the configured bounds when the consumer is slow.

Peak memory is measured with ``tracemalloc`` in the main process (``num_workers=0``): the
loader's bodies are ``bytearray``s and its samples ``bytes``, allocated by Python, so they
are traced. Each bound is checked together with a control run with a looser setting that
goes well over it, so the measurement demonstrably sees what the bound is about.
"""

from __future__ import annotations

import hashlib
import os
import time
import tracemalloc

import pytest

from concurrent_loader import ConcurrentDataLoader, FetchConfig, HedgeConfig, ObjectDataset
from concurrent_loader.stores import S3Config

from ._support import upload_objects

MiB = 1024 * 1024
OBJECT_SIZE = 256 * 1024
COUNT = 300
BATCH = 8
REQUESTS = 4
# Python objects besides bodies and samples (tasks, futures, buffers, digests).
SLACK = int(1.5 * MiB)


@pytest.fixture(scope="module")
def large_objects(tmp_path_factory, s3_server, reliability_bucket):
    """300 objects of 256 KB under ``s3://reliability/large/``."""
    bodies = {f"{i:04d}.bin": os.urandom(OBJECT_SIZE) for i in range(COUNT)}
    root = tmp_path_factory.mktemp("reliability_large")
    return upload_objects(s3_server, reliability_bucket, "large/", bodies, root)


def _slow_digest(data: bytes | bytearray) -> str:
    time.sleep(0.008)  # a decode slower than the fetches: bodies wait for it
    return hashlib.sha256(data).hexdigest()


def _peak_while_reading(ds, *, prefetch_batches: int, consumer_sleep: float) -> tuple[int, list]:
    """(peak traced bytes above the start, the samples) for one epoch with a slow consumer."""
    loader = ConcurrentDataLoader(
        ds,
        batch_size=BATCH,
        num_workers=0,
        prefetch_batches=prefetch_batches,
        decode_threads=1,
    )
    samples = []
    tracemalloc.start()
    try:
        start = tracemalloc.get_traced_memory()[0]
        for batch in loader:
            time.sleep(consumer_sleep)
            # Keep only something small, so the consumer holds one batch at a time.
            samples += [s if isinstance(s, str) else hashlib.sha256(s).hexdigest() for s in batch]
            del batch
        peak = tracemalloc.get_traced_memory()[1] - start
    finally:
        tracemalloc.stop()
    return peak, samples


def _dataset(objects, max_inflight_bytes: int, decode=None) -> ObjectDataset:
    return ObjectDataset(
        objects.url,
        objects.keys,
        decode=decode,
        fetch_config=FetchConfig(
            max_inflight_requests=REQUESTS, max_inflight_bytes=max_inflight_bytes
        ),
    )


def test_undecoded_bytes_stay_under_max_inflight_bytes(large_objects, s3_env):
    cap = 2 * MiB
    # Bodies held: the cap, overshot by at most the GETs in flight when it was reached,
    # plus the body on the decode thread.
    bound = cap + (REQUESTS + 1) * OBJECT_SIZE + SLACK

    peak, samples = _peak_while_reading(
        _dataset(large_objects, cap, _slow_digest), prefetch_batches=8, consumer_sleep=0.02
    )
    assert samples == large_objects.digests

    loose, _ = _peak_while_reading(
        _dataset(large_objects, 256 * MiB, _slow_digest), prefetch_batches=8, consumer_sleep=0.02
    )
    # Control: without the cap, bodies pile up in front of the slow decode.
    assert loose > 2 * bound, f"control peaked at only {loose / MiB:.1f} MiB"
    assert peak <= bound, (
        f"peak {peak / MiB:.1f} MiB with max_inflight_bytes={cap / MiB:.0f} MiB and "
        f"{REQUESTS} requests in flight (bound {bound / MiB:.1f} MiB; "
        f"{loose / MiB:.1f} MiB without the cap)"
    )


def test_decoded_batches_stay_under_prefetch_batches(large_objects, s3_env):
    cap = 2 * MiB
    batch_bytes = BATCH * OBJECT_SIZE

    def bound(prefetch: int) -> int:
        # Batches in progress plus the one the consumer holds, bodies as above.
        return (prefetch + 1) * batch_bytes + cap + (REQUESTS + 1) * OBJECT_SIZE + SLACK

    # decode=None: every sample is a 256 KB bytes copy of its body.
    peak, samples = _peak_while_reading(
        _dataset(large_objects, cap), prefetch_batches=2, consumer_sleep=0.03
    )
    assert samples == large_objects.digests
    assert peak <= bound(2), f"peak {peak / MiB:.1f} MiB, bound {bound(2) / MiB:.1f} MiB"

    # Control: a deeper prefetch fills up behind the slow consumer and goes over the bound.
    deep, _ = _peak_while_reading(
        _dataset(large_objects, cap), prefetch_batches=12, consumer_sleep=0.03
    )
    assert deep > bound(2) + 4 * batch_bytes, f"control peaked at only {deep / MiB:.1f} MiB"


@pytest.mark.parametrize("num_workers", [0, 2])
def test_requests_in_flight_stay_under_max_inflight_requests(
    small_objects, s3_env, proxy_factory, num_workers
):
    proxy = proxy_factory(latency_ms=100)
    limit = 4
    # Hedges have slots of their own beyond the limit (FetchConfig.max_hedges_in_flight,
    # tested in tests/fetch): off here, so every GET in flight is one of the limit's.
    no_hedges = HedgeConfig(enabled=False)
    ds = ObjectDataset(
        S3Config.from_url(small_objects.url, endpoint_url=proxy.endpoint_url),
        small_objects.keys[:64],
        fetch_config=FetchConfig(max_inflight_requests=limit, hedge=no_hedges),
    )
    # Four batches of eight in progress ask for 32 GETs at once.
    loader = ConcurrentDataLoader(ds, batch_size=8, num_workers=num_workers, prefetch_batches=4)
    assert sum(len(batch) for batch in loader) == 64
    allowed = limit * max(1, num_workers)
    observed = proxy.stats()["max_inflight"]
    assert observed >= limit, f"only {observed} GETs in flight at once: the demand did not show"
    assert observed <= allowed, (
        f"{observed} GETs in flight at once with max_inflight_requests={limit} "
        f"({num_workers} workers)"
    )
