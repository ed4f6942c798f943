"""ProxyServer through a real proxy process in front of the real local S3 server:
requests pass unchanged, connections are kept alive, and the counters add up."""

from __future__ import annotations

import http.client
import json
import threading
import time

from concurrent_loader.testing import FAULT_NAMES, FaultPlan, LocalS3Server

from ._proxy_support import (
    BIG_KEY,
    SMALL_KEYS,
    ProxyFactory,
    boto3_client,
    object_path,
    raw_get,
)


def test_passthrough_is_byte_identical(
    proxy_factory: ProxyFactory, s3_server: LocalS3Server, s3_bucket: str, objects: dict
) -> None:
    proxy = proxy_factory()
    client = boto3_client(proxy.endpoint_url, s3_server)
    try:
        # Signed requests: SigV4 covers the proxy's Host header, forwarded unchanged.
        body = client.get_object(Bucket=s3_bucket, Key=BIG_KEY)["Body"].read()
        assert body == objects[BIG_KEY] == s3_server.get_object(s3_bucket, BIG_KEY)
        ranged = client.get_object(Bucket=s3_bucket, Key=BIG_KEY, Range="bytes=1000-1999")
        assert ranged["Body"].read() == objects[BIG_KEY][1000:2000]
        assert client.head_object(Bucket=s3_bucket, Key=BIG_KEY)["ContentLength"] == 300_000
        # Large enough for boto3 to send "Expect: 100-continue", which it would wait out
        # for a second if the proxy did not answer it.
        start = time.monotonic()
        client.put_object(Bucket=s3_bucket, Key="proxy/uploaded.bin", Body=b"u" * 3_000_000)
        assert time.monotonic() - start < 0.9
        assert s3_server.get_object(s3_bucket, "proxy/uploaded.bin") == b"u" * 3_000_000
        keys = [o["Key"] for o in client.list_objects_v2(Bucket=s3_bucket)["Contents"]]
        assert BIG_KEY in keys
    finally:
        client.close()
    stats = proxy.stats()
    # boto3 kept one connection alive for all five requests, and so did the proxy upstream.
    assert stats["requests"] == 5
    assert stats["client_connections_total"] == 2  # boto3's and the stats request's
    assert stats["upstream_connections_total"] == 1
    assert stats["responses_by_status"] == {"200": 4, "206": 1}


def test_chunked_request_body_keeps_the_connection_in_sync(
    proxy_factory: ProxyFactory, s3_bucket: str, objects: dict
) -> None:
    proxy = proxy_factory()
    conn = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=10)
    try:
        # Anonymous writes are refused, but only after the whole chunked body was relayed.
        chunks = iter([b"a" * 100_000, b"b" * 50_000])
        conn.request(
            "PUT", object_path(s3_bucket, "proxy/chunked.bin"), body=chunks, encode_chunked=True
        )
        response = conn.getresponse()
        response.read()
        assert response.status == 403
        conn.request("GET", object_path(s3_bucket, SMALL_KEYS[1]))
        assert conn.getresponse().read() == objects[SMALL_KEYS[1]]
    finally:
        conn.close()


# -- counters ------------------------------------------------------------------------------


def test_inflight_counts_parallel_requests(
    proxy_factory: ProxyFactory, s3_bucket: str, objects: dict
) -> None:
    proxy = proxy_factory(latency_ms=400)
    barrier = threading.Barrier(6)
    results: list[bytes] = []

    def fetch(key: str) -> None:
        barrier.wait()
        results.append(raw_get(proxy, object_path(s3_bucket, key)).body)

    threads = [threading.Thread(target=fetch, args=(key,)) for key in SMALL_KEYS[:6]]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(results) == sorted(objects[key] for key in SMALL_KEYS[:6])
    stats = proxy.stats()
    assert (stats["max_inflight"], stats["inflight"]) == (6, 0)


def test_stats_and_reset_endpoints(
    proxy_factory: ProxyFactory, s3_bucket: str, objects: dict
) -> None:
    proxy = proxy_factory(faults=FaultPlan(seed=1, error_500=0.5))
    for key in SMALL_KEYS:
        raw_get(proxy, object_path(s3_bucket, key))
    stats = proxy.stats()
    assert stats["requests"] == 8
    assert stats["requests_by_method"] == {"GET": 8}
    assert set(stats["faults"]) == set(FAULT_NAMES)
    assert stats["faults"]["error_500"] == stats["responses_by_status"].get("500", 0)
    ok = stats["responses_by_status"].get("200", 0)
    assert ok + stats["faults"]["error_500"] == 8
    assert stats["bytes_sent"] > ok * 20_000

    # Plain HTTP, as a test in another process would do it; never counted or forwarded.
    conn = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=10)
    try:
        conn.request("GET", "/__proxy__/stats")
        response = conn.getresponse()
        assert response.getheader("Content-Type") == "application/json"
        assert json.loads(response.read())["requests"] == 8
        conn.request("POST", "/__proxy__/reset")
        assert conn.getresponse().read() == b"{}"
    finally:
        conn.close()
    stats = proxy.stats()
    assert stats["requests"] == stats["bytes_sent"] == stats["max_inflight"] == 0
    assert set(stats["faults"].values()) == {0}
