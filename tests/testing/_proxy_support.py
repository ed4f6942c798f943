"""Helpers shared by the proxy tests (no fixtures here: see conftest.py).

Responses are read on raw sockets, so a test sees exactly what a client would: status
codes and XML bodies, resets before or after the head, short bodies, silence.
"""

from __future__ import annotations

import socket
from collections.abc import Callable
from typing import Any

import boto3
from botocore.config import Config

from concurrent_loader.testing import LocalS3Server, ProxyProcess

ProxyFactory = Callable[..., ProxyProcess]
BIG_KEY = "proxy/big.bin"
SMALL_KEYS = [f"proxy/small-{i}.bin" for i in range(8)]


def boto3_client(endpoint_url: str, server: LocalS3Server) -> Any:
    """A signed, path-style client that never retries."""
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


def read_head(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """(status, lowercased headers, body bytes already received) of one response."""
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


def send_get(proxy: ProxyProcess, path: str, timeout: float = 10.0) -> socket.socket:
    """A fresh connection on which one anonymous GET was sent."""
    sock = socket.create_connection(("127.0.0.1", proxy.port), timeout=timeout)
    sock.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{proxy.port}\r\n\r\n".encode())
    return sock


def raw_get(proxy: ProxyProcess, path: str, timeout: float = 10.0) -> RawResponse:
    """One anonymous GET on a fresh connection (anonymous reads are allowed)."""
    with send_get(proxy, path, timeout) as sock:
        try:
            status, headers, body = read_head(sock)
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


def object_path(bucket: str, key: str) -> str:
    return f"/{bucket}/{key}"


def closed_port() -> int:
    """A port nothing listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
