"""First-byte latency and bandwidth caps, through a real proxy process in front of the real
local S3 server. Time is only bounded from below: the machine may be slow, never fast."""

from __future__ import annotations

import http.client
import time

from ._proxy_support import BIG_KEY, SMALL_KEYS, ProxyFactory, object_path, raw_get


def test_latency_holds_the_first_byte(
    proxy_factory: ProxyFactory, s3_bucket: str, objects: dict
) -> None:
    proxy = proxy_factory(latency_ms=150)
    conn = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=10)
    try:
        for _ in range(2):  # the second one reuses the kept-alive connection
            start = time.monotonic()
            conn.request("GET", object_path(s3_bucket, SMALL_KEYS[0]))
            response = conn.getresponse()
            first_byte = time.monotonic() - start
            assert response.read() == objects[SMALL_KEYS[0]]
            assert first_byte >= 0.15
    finally:
        conn.close()


def test_jitter_keeps_latency_within_bounds(
    proxy_factory: ProxyFactory, s3_bucket: str, objects: dict
) -> None:
    proxy = proxy_factory(latency_ms=100, jitter_ms=50)
    for key in SMALL_KEYS[:4]:
        start = time.monotonic()
        response = raw_get(proxy, object_path(s3_bucket, key))
        assert time.monotonic() - start >= 0.05
        assert response.body == objects[key]


def test_bandwidth_cap(proxy_factory: ProxyFactory, s3_bucket: str, objects: dict) -> None:
    proxy = proxy_factory(bandwidth_bytes_per_s=1_500_000)
    start = time.monotonic()
    response = raw_get(proxy, object_path(s3_bucket, BIG_KEY))
    elapsed = time.monotonic() - start
    assert response.body == objects[BIG_KEY]
    assert elapsed >= 0.9 * 300_000 / 1_500_000
