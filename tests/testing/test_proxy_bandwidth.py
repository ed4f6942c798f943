"""Bandwidth caps: the token bucket as a pure calculation, and the per-connection and total
caps of a real proxy process in front of the real local S3 server.

Time through the proxy is only bounded from below: the machine may be slow, never fast.
"""

from __future__ import annotations

import threading
import time

import pytest

from concurrent_loader.testing import ProxyProcess
from concurrent_loader.testing.proxy.bandwidth import TokenBucket

from ._proxy_support import BIG_KEY, ProxyFactory, object_path, raw_get

# -- the token bucket -------------------------------------------------------------------------


def test_token_bucket_makes_charges_wait_for_their_tokens() -> None:
    bucket = TokenBucket(rate=100.0)
    assert bucket.charge(50, now=0.0) == 0.5
    # A second caller at the same moment queues behind the first.
    assert bucket.charge(50, now=0.0) == 1.0
    assert bucket.charge(100, now=0.5) == 1.5
    # Idle time is not saved up without a burst: after a pause, a charge waits again.
    assert bucket.charge(100, now=10.0) == 1.0


def test_token_bucket_saves_at_most_its_burst() -> None:
    bucket = TokenBucket(rate=100.0, burst=50.0)
    assert bucket.charge(50, now=0.0) == 0.0
    assert bucket.charge(50, now=0.0) == 0.5
    # A long pause refills only the burst: 50 tokens are free, the next 50 are not.
    assert bucket.charge(50, now=100.0) == 0.0
    assert bucket.charge(50, now=100.0) == pytest.approx(0.5)


def test_token_bucket_never_lets_more_than_rate_through() -> None:
    # Three connections that each wait out their charge before the next one: whatever the
    # order, the last charge is paid no earlier than total / rate.
    bucket = TokenBucket(rate=1000.0)
    ready = [0.0, 0.0, 0.0]
    for step in range(30):
        conn = step % 3
        ready[conn] += bucket.charge(100 + 10 * conn, now=ready[conn])
    total = sum(100 + 10 * (step % 3) for step in range(30))
    assert max(ready) >= total / 1000.0


@pytest.mark.parametrize("rate", [0, -1, float("nan"), float("inf"), True])
def test_bad_rates_are_refused(rate: float) -> None:
    with pytest.raises(ValueError):
        TokenBucket(rate)
    with pytest.raises(ValueError):
        ProxyProcess("http://127.0.0.1:1", total_bandwidth=rate)
    with pytest.raises(ValueError):
        ProxyProcess("http://127.0.0.1:1", bandwidth_bytes_per_s=rate)


# -- through a real proxy -------------------------------------------------------------------


def test_bandwidth_cap(proxy_factory: ProxyFactory, s3_bucket: str, objects: dict) -> None:
    proxy = proxy_factory(bandwidth_bytes_per_s=1_500_000)
    start = time.monotonic()
    response = raw_get(proxy, object_path(s3_bucket, BIG_KEY))
    elapsed = time.monotonic() - start
    assert response.body == objects[BIG_KEY]
    assert elapsed >= 0.9 * 300_000 / 1_500_000


@pytest.mark.parametrize("per_connection", [None, 5_000_000])
def test_total_bandwidth_is_shared_by_all_connections(
    proxy_factory: ProxyFactory, s3_bucket: str, objects: dict, per_connection: float | None
) -> None:
    rate = 1_000_000
    proxy = proxy_factory(total_bandwidth=rate, bandwidth_bytes_per_s=per_connection)
    downloads = 3
    barrier = threading.Barrier(downloads)
    bodies: list[bytes] = []

    def fetch() -> None:
        barrier.wait()
        bodies.append(raw_get(proxy, object_path(s3_bucket, BIG_KEY)).body)

    threads = [threading.Thread(target=fetch) for _ in range(downloads)]
    start = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.monotonic() - start

    assert bodies == [objects[BIG_KEY]] * downloads
    sent = proxy.stats()["bytes_sent"]
    assert sent >= downloads * 300_000
    # Each connection may run ahead of the cap by one unpaid slice (rate / 50 bytes), and
    # by the debt under 1 ms it does not sleep for. A cap per connection would have let
    # the three through in a third of this time.
    slack = downloads * (rate / 50 + rate * 0.001)
    assert elapsed >= (sent - slack) / rate
