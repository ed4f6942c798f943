"""The fault-injecting proxy, as a real process in front of the real local S3 server.

Faults are observed the way a client sees them, on raw sockets: status codes and XML
bodies, resets before or after the head, short bodies, silence.
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import boto3
import botocore.exceptions
import pytest
from botocore.config import Config

from concurrent_loader.testing import FAULT_NAMES, FaultPlan, LocalS3Server, ProxyProcess

ProxyFactory = Callable[..., ProxyProcess]
BIG_KEY = "proxy/big.bin"
SMALL_KEYS = [f"proxy/small-{i}.bin" for i in range(8)]


@pytest.fixture(scope="module")
def objects(s3_server: LocalS3Server, s3_bucket: str) -> dict[str, bytes]:
    """One 300 KB object and a few 20 KB ones, by key."""
    data = {BIG_KEY: os.urandom(300_000)}
    data.update({key: os.urandom(20_000) for key in SMALL_KEYS})
    for key, body in data.items():
        s3_server.put_object(s3_bucket, key, body)
    return data


def _boto3_client(endpoint_url: str, server: LocalS3Server) -> Any:
    return boto3.session.Session().client(
        "s3",
        endpoint_url=endpoint_url,
        aws_access_key_id=server.access_key,
        aws_secret_access_key=server.secret_key,
        region_name=server.region,
        config=Config(s3={"addressing_style": "path"}, retries={"total_max_attempts": 1}),
    )


class RawResponse:
    """What a client received on one request: head, body bytes and how the stream ended."""

    def __init__(self, status: int, headers: dict[str, str], body: bytes, end: str) -> None:
        self.status, self.headers, self.body, self.end = status, headers, body, end

    @property
    def content_length(self) -> int:
        return int(self.headers["content-length"])


def _read_head(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    buf = b""
    while b"\r\n\r\n" not in buf:
        data = sock.recv(65536)
        if not data:
            raise ConnectionError("closed before the response head")
        buf += data
    head, _, rest = buf.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return int(lines[0].split()[1]), headers, rest


def _send_get(proxy: ProxyProcess, path: str, timeout: float = 10.0) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", proxy.port), timeout=timeout)
    sock.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{proxy.port}\r\n\r\n".encode())
    return sock


def raw_get(proxy: ProxyProcess, path: str, timeout: float = 10.0) -> RawResponse:
    """One anonymous GET on a fresh connection (anonymous reads are allowed)."""
    with _send_get(proxy, path, timeout) as sock:
        try:
            status, headers, body = _read_head(sock)
        except ConnectionResetError:
            return RawResponse(0, {}, b"", "reset")
        length = int(headers.get("content-length", -1))
        try:
            while len(body) < length:
                data = sock.recv(65536)
                if not data:
                    return RawResponse(status, headers, body, "closed")
                body += data
        except ConnectionResetError:
            return RawResponse(status, headers, body, "reset")
        return RawResponse(status, headers, body, "complete")


def symptom(response: RawResponse) -> str:
    """The fault name a client-visible response corresponds to ("ok" for none)."""
    if response.status == 0:
        return "reset_before"
    if response.status == 503 and b"<Code>SlowDown</Code>" in response.body:
        return "slowdown_503"
    if response.status == 500 and b"<Code>InternalError</Code>" in response.body:
        return "error_500"
    if response.end == "reset":
        return "reset_mid_body"
    if response.end == "closed":
        return "truncate"
    assert response.status == 200, response.status
    return "ok"


def _path(bucket: str, key: str) -> str:
    return f"/{bucket}/{key}"


# -- passthrough and shaping ---------------------------------------------------------------


def test_passthrough_is_byte_identical(
    proxy_factory: ProxyFactory, s3_server: LocalS3Server, s3_bucket: str, objects: dict
) -> None:
    proxy = proxy_factory()
    client = _boto3_client(proxy.endpoint_url, s3_server)
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
        conn.request("PUT", _path(s3_bucket, "proxy/chunked.bin"), body=chunks, encode_chunked=True)
        response = conn.getresponse()
        response.read()
        assert response.status == 403
        conn.request("GET", _path(s3_bucket, SMALL_KEYS[1]))
        assert conn.getresponse().read() == objects[SMALL_KEYS[1]]
    finally:
        conn.close()


def test_latency_holds_the_first_byte(
    proxy_factory: ProxyFactory, s3_bucket: str, objects: dict
) -> None:
    proxy = proxy_factory(latency_ms=150)
    conn = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=10)
    try:
        for _ in range(2):  # the second one reuses the kept-alive connection
            start = time.monotonic()
            conn.request("GET", _path(s3_bucket, SMALL_KEYS[0]))
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
        response = raw_get(proxy, _path(s3_bucket, key))
        assert time.monotonic() - start >= 0.05
        assert response.body == objects[key]


def test_bandwidth_cap(proxy_factory: ProxyFactory, s3_bucket: str, objects: dict) -> None:
    proxy = proxy_factory(bandwidth_bytes_per_s=1_500_000)
    start = time.monotonic()
    response = raw_get(proxy, _path(s3_bucket, BIG_KEY))
    elapsed = time.monotonic() - start
    assert response.body == objects[BIG_KEY]
    assert elapsed >= 0.9 * 300_000 / 1_500_000


# -- faults, one at a time ---------------------------------------------------------------


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_slowdown_503_never_reaches_upstream(proxy_factory: ProxyFactory) -> None:
    dead_upstream = f"http://127.0.0.1:{_closed_port()}"
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
    response = raw_get(proxy, _path(s3_bucket, SMALL_KEYS[0]))
    assert response.status == 500
    assert b"<Code>InternalError</Code>" in response.body


def test_reset_before_any_byte(proxy_factory: ProxyFactory, s3_bucket: str, objects: dict) -> None:
    proxy = proxy_factory(faults=FaultPlan(reset_before=1.0))
    with (
        _send_get(proxy, _path(s3_bucket, SMALL_KEYS[0])) as sock,
        pytest.raises(ConnectionResetError),
    ):
        sock.recv(65536)
    # And through a stock HTTP client:
    conn = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=10)
    try:
        conn.request("GET", _path(s3_bucket, SMALL_KEYS[0]))
        with pytest.raises(ConnectionResetError):
            conn.getresponse()
    finally:
        conn.close()
    assert proxy.stats()["faults"]["reset_before"] == 2


def test_reset_mid_body(proxy_factory: ProxyFactory, s3_bucket: str, objects: dict) -> None:
    proxy = proxy_factory(faults=FaultPlan(reset_mid_body=1.0))
    response = raw_get(proxy, _path(s3_bucket, BIG_KEY))
    assert response.status == 200
    assert response.content_length == 300_000
    assert response.end == "reset"
    assert response.body == objects[BIG_KEY][:150_000]


def test_truncate_closes_cleanly_after_half(
    proxy_factory: ProxyFactory, s3_bucket: str, objects: dict
) -> None:
    proxy = proxy_factory(faults=FaultPlan(truncate=1.0))
    response = raw_get(proxy, _path(s3_bucket, BIG_KEY))
    assert (response.status, response.content_length, response.end) == (200, 300_000, "closed")
    assert response.body == objects[BIG_KEY][:150_000]
    conn = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=10)
    try:
        conn.request("GET", _path(s3_bucket, BIG_KEY))
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
    with _send_get(proxy, _path(s3_bucket, SMALL_KEYS[0])) as sock:
        status, headers, body = _read_head(sock)
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
    response = raw_get(proxy, _path(s3_bucket, SMALL_KEYS[0]))
    assert time.monotonic() - start >= 0.3
    assert response.body == objects[SMALL_KEYS[0]]
    assert proxy.stats()["faults"]["slow"] == 1


def test_faults_only_hit_object_gets(
    proxy_factory: ProxyFactory, s3_server: LocalS3Server, s3_bucket: str, objects: dict
) -> None:
    proxy = proxy_factory(faults=FaultPlan(slowdown_503=1.0))
    client = _boto3_client(proxy.endpoint_url, s3_server)
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
    return {(key, n): symptom(raw_get(proxy, _path(bucket, key))) for key, n in order}


def test_same_seed_same_faults(proxy_factory: ProxyFactory, s3_bucket: str, objects: dict) -> None:
    key_major = [(key, n) for key in SMALL_KEYS for n in range(3)]
    round_robin = [(key, n) for n in range(3) for key in SMALL_KEYS]
    proxy = proxy_factory(faults=MIXED_PLAN)

    first = _run_sequence(proxy, s3_bucket, key_major)
    predicted = {
        (key, n): MIXED_PLAN.fault_for("GET", _path(s3_bucket, key), n) or "ok"
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


def test_proxy_process_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError):
        ProxyProcess("ftp://127.0.0.1:1")
    with pytest.raises(ValueError):
        ProxyProcess("http://127.0.0.1:1", latency_ms=-5)
    with pytest.raises(ValueError):
        ProxyProcess("http://127.0.0.1:1", bandwidth_bytes_per_s=0)
    with pytest.raises(TypeError):
        ProxyProcess("http://127.0.0.1:1", faults={"slowdown_503": 0.1})  # type: ignore[arg-type]


# -- counters and lifecycle -----------------------------------------------------------------


def test_inflight_counts_parallel_requests(
    proxy_factory: ProxyFactory, s3_bucket: str, objects: dict
) -> None:
    proxy = proxy_factory(latency_ms=400)
    barrier = threading.Barrier(6)
    results: list[bytes] = []

    def fetch(key: str) -> None:
        barrier.wait()
        results.append(raw_get(proxy, _path(s3_bucket, key)).body)

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
        raw_get(proxy, _path(s3_bucket, key))
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


def test_stop_leaves_no_process(proxy_factory: ProxyFactory, s3_bucket: str, objects: dict) -> None:
    proxy = proxy_factory(faults=FaultPlan(stall=1.0, stall_seconds=60.0), cpus={0})
    assert os.sched_getaffinity(proxy.pid) == {0}
    assert proxy.cpu_seconds() > 0
    with _send_get(proxy, _path(s3_bucket, SMALL_KEYS[0])) as sock:
        assert _read_head(sock)[0] == 200  # a stall is in progress
        pid = proxy.pid
        start = time.monotonic()
        proxy.stop()
        assert time.monotonic() - start < 3.0
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
        assert sock.recv(65536) == b""
    proxy.stop()  # idempotent
    with pytest.raises(RuntimeError, match="only once"):
        proxy.start()


def _process_ended(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"  # exited, not yet reaped
    except FileNotFoundError:
        return True


def test_proxy_dies_with_its_parent() -> None:
    script = (
        "import os, sys\n"
        "from concurrent_loader.testing import ProxyProcess\n"
        "proxy = ProxyProcess('http://127.0.0.1:9').start()\n"
        "print(proxy.pid, flush=True)\n"
        "os.kill(os.getpid(), 9)\n"
    )
    repo_root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(repo_root)}
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, env=env, timeout=60, check=False
    )
    assert result.returncode == -9, result.stderr
    pid = int(result.stdout)
    deadline = time.monotonic() + 10
    while not _process_ended(pid):
        assert time.monotonic() < deadline, "the proxy outlived its parent"
        time.sleep(0.05)
