"""The proxy's tampering faults on raw sockets: a corrupted body keeps its length and
framing with one byte inverted; stray bytes follow a complete response on an open
connection."""

from __future__ import annotations

import socket

from concurrent_loader.testing import FaultPlan

from ._proxy_support import BIG_KEY, SMALL_KEYS, ProxyFactory, object_path, raw_get, read_head


def test_corrupt_inverts_one_byte_and_keeps_the_length(
    proxy_factory: ProxyFactory, s3_bucket: str, objects: dict[str, bytes]
) -> None:
    proxy = proxy_factory(faults=FaultPlan(corrupt=1.0))
    for key in (BIG_KEY, SMALL_KEYS[0]):
        response = raw_get(proxy, object_path(s3_bucket, key))
        sent = objects[key]
        assert response.status == 200
        assert response.end == "complete"
        assert response.content_length == len(response.body) == len(sent)
        differing = [i for i, (a, b) in enumerate(zip(response.body, sent, strict=True)) if a != b]
        assert differing == [len(sent) // 2]
        assert response.body[len(sent) // 2] == sent[len(sent) // 2] ^ 0xFF
    assert proxy.stats()["faults"]["corrupt"] == 2


def test_corrupt_leaves_error_responses_alone(
    proxy_factory: ProxyFactory, s3_bucket: str, objects: dict[str, bytes]
) -> None:
    proxy = proxy_factory(faults=FaultPlan(corrupt=1.0))
    response = raw_get(proxy, object_path(s3_bucket, "proxy/no-such-key"))
    assert response.status == 404
    assert b"<Code>NoSuchKey</Code>" in response.body


def test_stray_bytes_follow_a_complete_response_on_an_open_connection(
    proxy_factory: ProxyFactory, s3_bucket: str, objects: dict[str, bytes]
) -> None:
    proxy = proxy_factory(faults=FaultPlan(stray_bytes=1.0))
    key = SMALL_KEYS[1]
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as sock:
        path = object_path(s3_bucket, key)
        sock.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{proxy.port}\r\n\r\n".encode())
        status, headers, received = read_head(sock)
        stray = b'HTTP/1.1 200 OK\r\nContent-Length: 5\r\nETag: "stray"\r\n\r\nstray'
        want = len(objects[key]) + len(stray)
        while len(received) < want:
            data = sock.recv(65536)
            assert data, "the connection closed before the stray bytes"
            received += data
        assert status == 200
        assert "close" not in headers.get("connection", "")
        assert received[: len(objects[key])] == objects[key]  # the response itself is intact
        assert received[len(objects[key]) :] == stray
    assert proxy.stats()["faults"]["stray_bytes"] == 1


def test_tampering_faults_reach_the_proxy_process() -> None:
    plan = FaultPlan(seed=3, corrupt=0.25, stray_bytes=0.5)
    args = plan.to_cli_args()
    assert args[args.index("--corrupt") + 1] == repr(0.25)
    assert args[args.index("--stray-bytes") + 1] == repr(0.5)
    drawn = {plan.fault_for("GET", f"/b/k{i}", 0) for i in range(200)}
    assert {"corrupt", "stray_bytes", None} == drawn
