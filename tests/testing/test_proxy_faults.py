"""Faults injected by the proxy, observed the way a client sees them on raw sockets, and
the FaultPlan that picks them: pure, seeded and reproducible."""

from __future__ import annotations

import http.client
import time

import botocore.exceptions
import pytest

from concurrent_loader.testing import FaultPlan, LocalS3Server, ProxyProcess

from ._proxy_support import (
    BIG_KEY,
    SMALL_KEYS,
    ProxyFactory,
    boto3_client,
    closed_port,
    object_path,
    raw_get,
    read_head,
    send_get,
    symptom,
)

# -- one fault at a time -------------------------------------------------------------------


def test_slowdown_503_never_reaches_upstream(proxy_factory: ProxyFactory) -> None:
    dead_upstream = f"http://127.0.0.1:{closed_port()}"
    proxy = proxy_factory(dead_upstream, faults=FaultPlan(slowdown_503=1.0))
    conn = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=10)
    try:
        for _ in range(2):  # and the connection stays usable, as with S3
            conn.request("GET", "/bucket/some/key.jpg")
            response = conn.getresponse()
            body = response.read()
            assert response.status == 503
            assert response.getheader("Content-Type") == "application/xml"
            assert b"<Code>SlowDown</Code>" in body
            assert b"<Resource>/bucket/some/key.jpg</Resource>" in body
    finally:
        conn.close()
    stats = proxy.stats()
    assert stats["faults"]["slowdown_503"] == 2
    assert stats["upstream_connections_total"] == 0


def test_error_500(proxy_factory: ProxyFactory, s3_bucket: str, objects: dict) -> None:
    proxy = proxy_factory(faults=FaultPlan(error_500=1.0))
    response = raw_get(proxy, object_path(s3_bucket, SMALL_KEYS[0]))
    assert response.status == 500
    assert b"<Code>InternalError</Code>" in response.body


def test_reset_before_any_byte(proxy_factory: ProxyFactory, s3_bucket: str, objects: dict) -> None:
    proxy = proxy_factory(faults=FaultPlan(reset_before=1.0))
    with (
        send_get(proxy, object_path(s3_bucket, SMALL_KEYS[0])) as sock,
        pytest.raises(ConnectionResetError),
    ):
        sock.recv(65536)
    # And through a stock HTTP client:
    conn = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=10)
    try:
        conn.request("GET", object_path(s3_bucket, SMALL_KEYS[0]))
        with pytest.raises(ConnectionResetError):
            conn.getresponse()
    finally:
        conn.close()
    assert proxy.stats()["faults"]["reset_before"] == 2


def test_reset_mid_body(proxy_factory: ProxyFactory, s3_bucket: str, objects: dict) -> None:
    proxy = proxy_factory(faults=FaultPlan(reset_mid_body=1.0))
    response = raw_get(proxy, object_path(s3_bucket, BIG_KEY))
    assert response.status == 200
    assert response.content_length == 300_000
    assert response.end == "reset"
    assert response.body == objects[BIG_KEY][:150_000]


def test_truncate_closes_cleanly_after_half(
    proxy_factory: ProxyFactory, s3_bucket: str, objects: dict
) -> None:
    proxy = proxy_factory(faults=FaultPlan(truncate=1.0))
    response = raw_get(proxy, object_path(s3_bucket, BIG_KEY))
    assert (response.status, response.content_length, response.end) == (200, 300_000, "closed")
    assert response.body == objects[BIG_KEY][:150_000]
    conn = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=10)
    try:
        conn.request("GET", object_path(s3_bucket, BIG_KEY))
        with pytest.raises(http.client.IncompleteRead) as info:
            conn.getresponse().read()
        assert (len(info.value.partial), info.value.expected) == (150_000, 150_000)
    finally:
        conn.close()


def test_stall_sends_head_then_nothing(
    proxy_factory: ProxyFactory, s3_bucket: str, objects: dict
) -> None:
    proxy = proxy_factory(faults=FaultPlan(stall=1.0, stall_seconds=1.0))
    start = time.monotonic()
    with send_get(proxy, object_path(s3_bucket, SMALL_KEYS[0])) as sock:
        status, headers, body = read_head(sock)
        assert (status, int(headers["content-length"]), body) == (200, 20_000, b"")
        sock.settimeout(0.3)
        with pytest.raises(TimeoutError):
            sock.recv(65536)
        sock.settimeout(10)
        assert sock.recv(65536) == b""  # closed once the stall is over
    assert time.monotonic() - start >= 1.0


def test_slow_adds_extra_latency(
    proxy_factory: ProxyFactory, s3_bucket: str, objects: dict
) -> None:
    proxy = proxy_factory(faults=FaultPlan(slow=1.0, extra_latency_ms=300))
    start = time.monotonic()
    response = raw_get(proxy, object_path(s3_bucket, SMALL_KEYS[0]))
    assert time.monotonic() - start >= 0.3
    assert response.body == objects[SMALL_KEYS[0]]
    assert proxy.stats()["faults"]["slow"] == 1


def test_faults_only_hit_object_gets(
    proxy_factory: ProxyFactory, s3_server: LocalS3Server, s3_bucket: str, objects: dict
) -> None:
    proxy = proxy_factory(faults=FaultPlan(slowdown_503=1.0))
    client = boto3_client(proxy.endpoint_url, s3_server)
    try:
        client.list_objects_v2(Bucket=s3_bucket, Prefix="proxy/")
        client.put_object(Bucket=s3_bucket, Key="proxy/put-through-faults.bin", Body=b"p")
        client.head_object(Bucket=s3_bucket, Key=BIG_KEY)
        with pytest.raises(botocore.exceptions.ClientError) as info:
            client.get_object(Bucket=s3_bucket, Key=BIG_KEY)
        assert info.value.response["Error"]["Code"] == "SlowDown"
        assert info.value.response["ResponseMetadata"]["HTTPStatusCode"] == 503
    finally:
        client.close()
    assert proxy.stats()["faults"]["slowdown_503"] == 1


# -- determinism ---------------------------------------------------------------------------


MIXED_PLAN = FaultPlan(
    seed=3, slowdown_503=0.15, error_500=0.15, reset_before=0.1, reset_mid_body=0.1, truncate=0.1
)


def _run_sequence(proxy: ProxyProcess, bucket: str, order: list[tuple[str, int]]) -> dict:
    return {(key, n): symptom(raw_get(proxy, object_path(bucket, key))) for key, n in order}


def test_same_seed_same_faults(proxy_factory: ProxyFactory, s3_bucket: str, objects: dict) -> None:
    key_major = [(key, n) for key in SMALL_KEYS for n in range(3)]
    round_robin = [(key, n) for n in range(3) for key in SMALL_KEYS]
    proxy = proxy_factory(faults=MIXED_PLAN)

    first = _run_sequence(proxy, s3_bucket, key_major)
    predicted = {
        (key, n): MIXED_PLAN.fault_for("GET", object_path(s3_bucket, key), n) or "ok"
        for key, n in key_major
    }
    assert first == predicted
    assert len(set(first.values())) >= 4  # the plan really mixes faults

    proxy.reset_stats()  # also restarts every key's request count
    assert _run_sequence(proxy, s3_bucket, round_robin) == first

    other = proxy_factory(faults=MIXED_PLAN)
    assert _run_sequence(other, s3_bucket, key_major) == first

    reseeded = proxy_factory(faults=FaultPlan(**{**vars(MIXED_PLAN), "seed": 4}))
    assert _run_sequence(reseeded, s3_bucket, key_major) != first


def test_fault_plan_is_pure_and_matches_rates() -> None:
    plan = FaultPlan(seed=11, slowdown_503=0.1, truncate=0.05)
    draws = [plan.fault_for("GET", f"/b/k{i}", 0) for i in range(20_000)]
    assert draws == [plan.fault_for("GET", f"/b/k{i}", 0) for i in range(20_000)]
    assert 0.08 < draws.count("slowdown_503") / len(draws) < 0.12
    assert 0.035 < draws.count("truncate") / len(draws) < 0.065
    # A retry of the same request gets a fresh draw.
    assert [plan.fault_for("GET", "/b/k0", n) for n in range(200)].count(None) < 200
    assert plan.fault_for("PUT", "/b/k", 0) is None
    always = FaultPlan(error_500=1.0)
    assert always.fault_for("GET", "/b/k?versionId=1", 0) == "error_500"
    assert always.fault_for("GET", "/b", 0) is None  # listing
    assert always.fault_for("GET", "/b/?list-type=2", 0) is None
    assert FaultPlan(error_500=1.0, faults_on=("get", "HEAD")).faults_on == ("GET", "HEAD")


@pytest.mark.parametrize(
    "kwargs",
    [
        {"slowdown_503": -0.1},
        {"truncate": 1.5},
        {"slowdown_503": 0.6, "error_500": 0.6},
        {"stall_seconds": -1.0},
        {"extra_latency_ms": float("nan")},
        {"faults_on": "GET"},
        {"seed": 1.5},
    ],
)
def test_fault_plan_rejects_bad_values(kwargs: dict) -> None:
    with pytest.raises(ValueError):
        FaultPlan(**kwargs)


# -- a scripted SlowDown storm -------------------------------------------------------------


def test_a_storm_answers_every_object_get_503_within_its_window(
    proxy_factory: ProxyFactory, s3_bucket: str, objects: dict
) -> None:
    plan = FaultPlan(storm_start_s=0.3, storm_seconds=0.6)
    proxy = proxy_factory(faults=plan)
    path = object_path(s3_bucket, SMALL_KEYS[0])
    started = time.monotonic()
    seen: list[tuple[float, int]] = []
    while time.monotonic() - started < 1.3:
        seen.append((time.monotonic() - started, raw_get(proxy, path).status))
        time.sleep(0.02)
    # Clear of the edges (the storm's clock starts at the proxy's first object GET):
    before = [status for t, status in seen if t < 0.25]
    during = [status for t, status in seen if 0.35 < t < 0.85]
    after = [status for t, status in seen if t > 0.95]
    assert before and set(before) == {200}
    assert during and set(during) == {503}
    assert after and set(after) == {200}
    stats = proxy.stats()
    assert stats["storm_503"] == stats["faults"]["slowdown_503"]
    assert stats["storm_503"] == sum(1 for _, status in seen if status == 503)
    # Listings are never stormed.
    assert raw_get(proxy, f"/{s3_bucket}?list-type=2").status == 200


def test_a_storm_window_is_validated_and_reaches_the_proxy_process() -> None:
    plan = FaultPlan(storm_start_s=5, storm_seconds=30)
    assert plan.any_faults and plan.in_storm(5.0) and plan.in_storm(34.9)
    assert not plan.in_storm(4.9) and not plan.in_storm(35.0)
    assert "--storm-seconds" in plan.to_cli_args()
    with pytest.raises(ValueError):
        FaultPlan(storm_seconds=-1)
