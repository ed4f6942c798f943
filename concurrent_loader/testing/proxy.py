"""An HTTP/1.1 reverse proxy that makes a local S3 server behave like a remote one.

It sits between a client and a real S3-compatible server (see
:class:`~concurrent_loader.testing.server.LocalS3Server`) and adds what a laptop-local
server lacks: time to first byte (``latency_ms`` +- ``jitter_ms``), a per-connection
bandwidth cap, and injected faults (503 SlowDown, 500, connection resets before or in the
middle of a body, truncated bodies, stalls, extra slow responses).

Guarantees:

* Requests are forwarded unchanged (request line, ``Host`` and ``Authorization`` headers
  included), so SigV4 signatures computed for the proxy's address stay valid upstream.
  Only hop-by-hop headers (``Connection``, ``Keep-Alive``, ``Expect``...) are rewritten.
* Whether a request gets a fault is a pure function of ``(seed, method, path with query,
  n)``, where ``n`` counts the earlier requests with the same method and path. The same
  request sequence therefore sees the same faults, whatever the interleaving across keys,
  and a retried request gets a fresh but reproducible draw. Faults only hit object
  requests (``/bucket/key``) whose method is in ``FaultPlan.faults_on`` (``GET`` by
  default); bucket listings and uploads always pass.
* Latency is measured from the arrival of the request head to the first response byte,
  so the upstream's own time is hidden inside it rather than added to it.
* Counters are served at ``GET /__proxy__/stats`` (JSON) and cleared, together with the
  per-request history behind ``n``, by ``POST /__proxy__/reset``. Neither is forwarded.

The proxy runs as its own process (``python -m concurrent_loader.testing.proxy --help``)
so that its CPU time can be measured and pinned apart from the code under test;
:class:`ProxyProcess` starts and stops it. This module imports only the standard library
(plus ``uvloop`` and ``psutil`` when installed) so the process starts fast: it is launched
as a plain script and never imports the rest of the package.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import fcntl
import hashlib
import http.client
import json
import logging
import math
import os
import selectors
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import termios
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import IO, Any
from urllib.parse import urlsplit
from xml.sax.saxutils import escape as xml_escape

__all__ = [
    "FAULT_NAMES",
    "FaultPlan",
    "ProxyProcess",
    "ProxyServer",
    "main",
    "process_cpu_seconds",
]

logger = logging.getLogger("concurrent_loader.testing.proxy")

#: Every fault a plan can inject, in the order the single uniform draw is partitioned.
FAULT_NAMES: tuple[str, ...] = (
    "slowdown_503",
    "error_500",
    "reset_before",
    "reset_mid_body",
    "truncate",
    "stall",
    "slow",
)

STATS_PATH = "/__proxy__/stats"
RESET_PATH = "/__proxy__/reset"

# Big relay chunks keep the per-byte CPU cost low; the proxy shares a core with the server
# in benchmarks.
_CHUNK = 256 * 1024
_HEAD_LIMIT = 64 * 1024
# The upstream (Go net/http) closes idle keep-alive connections after a while; reconnecting
# before that avoids racing its close.
_UPSTREAM_MAX_IDLE_S = 10.0
# Where relayed bytes go: the paced client writer, an upstream writer, or nowhere.
_Sink = Callable[[bytes], Awaitable[None]]
_HOP_BY_HOP = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-connection",
        b"expect",
        b"te",
        b"trailer",
        b"upgrade",
    }
)


# --------------------------------------------------------------------------------------
# Fault plan: a frozen value object, and the pure decision function.
# --------------------------------------------------------------------------------------


def _draws(seed: int, method: str, target: str, n: int) -> tuple[float, float]:
    """Two independent uniforms in [0, 1) for one request: (fault draw, jitter draw)."""
    digest = hashlib.blake2b(
        f"{seed}\x00{method}\x00{target}\x00{n}".encode(), digest_size=16
    ).digest()
    return (
        int.from_bytes(digest[:8], "big") / 2.0**64,
        int.from_bytes(digest[8:], "big") / 2.0**64,
    )


def is_object_target(target: str) -> bool:
    """True for a path-style object request target (``/bucket/key...``)."""
    path = target.split("?", 1)[0]
    bucket, _, key = path.lstrip("/").partition("/")
    return bool(bucket) and bool(key) and not path.startswith("/__proxy__/")


@dataclass(frozen=True)
class FaultPlan:
    """Which faults to inject and how often; all rates are probabilities per request.

    The rates partition one uniform draw, so at most one fault hits a request and their
    sum must not exceed 1. ``slow`` delays the first byte by ``extra_latency_ms`` on top
    of the proxy's latency; ``stall`` sends the response head, then nothing for
    ``stall_seconds``, then closes.
    """

    seed: int = 0
    slowdown_503: float = 0.0
    error_500: float = 0.0
    reset_before: float = 0.0
    reset_mid_body: float = 0.0
    truncate: float = 0.0
    stall: float = 0.0
    slow: float = 0.0
    stall_seconds: float = 30.0
    extra_latency_ms: float = 0.0
    faults_on: tuple[str, ...] = ("GET",)

    def __post_init__(self) -> None:
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise ValueError(f"seed must be an int, got {self.seed!r}")
        total = 0.0
        for name in FAULT_NAMES:
            rate = getattr(self, name)
            if isinstance(rate, bool) or not isinstance(rate, (int, float)):
                raise ValueError(f"{name} must be a number in [0, 1], got {rate!r}")
            if not 0.0 <= rate <= 1.0:
                raise ValueError(f"{name} must be in [0, 1], got {rate!r}")
            total += rate
        if total > 1.0 + 1e-9:
            raise ValueError(f"fault rates must sum to at most 1, got {total:g}")
        for name in ("stall_seconds", "extra_latency_ms"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
        if isinstance(self.faults_on, str):
            raise ValueError("faults_on must be a sequence of HTTP methods, not a string")
        methods = tuple(str(m).upper() for m in self.faults_on)
        if not all(m.isalpha() for m in methods):
            raise ValueError(f"faults_on must hold HTTP method names, got {self.faults_on!r}")
        # Accept any sequence but store a tuple so the plan stays hashable.
        object.__setattr__(self, "faults_on", methods)

    @property
    def any_faults(self) -> bool:
        return any(getattr(self, name) > 0.0 for name in FAULT_NAMES)

    def fault_for(self, method: str, target: str, n: int) -> str | None:
        """The fault for the ``n``-th earlier-seen request ``method target``, or None.

        ``target`` is the request target as sent (path and query). Pure: the same
        arguments give the same answer in any process.
        """
        if method not in self.faults_on or not is_object_target(target):
            return None
        draw, _ = _draws(self.seed, method, target, n)
        cumulative = 0.0
        for name in FAULT_NAMES:
            cumulative += getattr(self, name)
            if draw < cumulative:
                return name
        return None

    def to_cli_args(self) -> list[str]:
        """The command-line flags of the proxy process that reproduce this plan."""
        args = ["--seed", str(self.seed)]
        for field in dataclasses.fields(self):
            if field.name in ("seed", "faults_on"):
                continue
            args += ["--" + field.name.replace("_", "-"), repr(float(getattr(self, field.name)))]
        args += ["--faults-on", ",".join(self.faults_on)]
        return args


# --------------------------------------------------------------------------------------
# The proxy itself (runs inside the proxy process).
# --------------------------------------------------------------------------------------


class _Stats:
    """Counters served at ``/__proxy__/stats``; plain ints, the loop is single-threaded.

    Request, status and byte counters cover proxied requests only (not the control
    endpoints); connection counters include every accepted connection.
    """

    def __init__(self) -> None:
        self.client_connections = 0
        self.inflight = 0
        self.reset()

    def reset(self) -> None:
        self.requests = 0
        self.requests_by_method: Counter[str] = Counter()
        self.responses_by_status: Counter[str] = Counter()
        self.faults: Counter[str] = Counter({name: 0 for name in FAULT_NAMES})
        self.bytes_sent = 0
        # Requests already in flight stay counted, so max never drops below current.
        self.max_inflight = self.inflight
        self.client_connections_total = 0
        self.upstream_connections_total = 0
        self.upstream_errors = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "requests": self.requests,
            "requests_by_method": dict(self.requests_by_method),
            "responses_by_status": dict(self.responses_by_status),
            "faults": dict(self.faults),
            "bytes_sent": self.bytes_sent,
            "inflight": self.inflight,
            "max_inflight": self.max_inflight,
            "client_connections": self.client_connections,
            "client_connections_total": self.client_connections_total,
            "upstream_connections_total": self.upstream_connections_total,
            "upstream_errors": self.upstream_errors,
        }


class _Request:
    __slots__ = (
        "arrival",
        "chunked",
        "content_length",
        "expects_continue",
        "header_lines",
        "keep_alive",
        "method",
        "target",
    )

    def __init__(self, head: bytes, arrival: float) -> None:
        lines = head[:-4].split(b"\r\n")
        parts = lines[0].split(b" ")
        if len(parts) != 3 or not parts[2].startswith(b"HTTP/1."):
            raise ValueError(f"malformed request line {lines[0][:200]!r}")
        self.method = parts[0].decode("ascii")
        self.target = parts[1].decode("ascii")
        self.arrival = arrival
        http10 = parts[2] == b"HTTP/1.0"
        self.header_lines: list[bytes] = []
        connection = b""
        self.expects_continue = False
        self.content_length = 0
        self.chunked = False
        for line in lines[1:]:
            name, sep, value = line.partition(b":")
            if not sep:
                raise ValueError(f"malformed header line {line[:200]!r}")
            lname = name.strip().lower()
            value = value.strip()
            if lname == b"connection":
                connection = value.lower()
            elif lname == b"expect":
                self.expects_continue = value.lower() == b"100-continue"
            elif lname == b"content-length":
                self.content_length = int(value)
            elif lname == b"transfer-encoding":
                self.chunked = b"chunked" in value.lower()
            if lname not in _HOP_BY_HOP:
                self.header_lines.append(line)
        self.keep_alive = b"keep-alive" in connection if http10 else b"close" not in connection
        self.expects_continue = self.expects_continue and self.has_body

    @property
    def has_body(self) -> bool:
        return self.chunked or self.content_length > 0

    def upstream_head(self) -> bytes:
        return (
            b"\r\n".join(
                [f"{self.method} {self.target} HTTP/1.1".encode("ascii"), *self.header_lines]
            )
            + b"\r\n\r\n"
        )


class _Response:
    __slots__ = (
        "chunked",
        "close_delimited",
        "header_lines",
        "length",
        "status",
        "status_line",
        "upstream_closes",
    )

    def __init__(self, head: bytes, request_method: str) -> None:
        lines = head[:-4].split(b"\r\n")
        self.status_line = lines[0]
        parts = lines[0].split(b" ", 2)
        if len(parts) < 2 or not parts[0].startswith(b"HTTP/1."):
            raise ValueError(f"malformed status line {lines[0][:200]!r}")
        self.status = int(parts[1])
        self.header_lines: list[bytes] = []
        self.length: int | None = None
        self.chunked = False
        self.upstream_closes = parts[0] == b"HTTP/1.0"
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            lname = name.strip().lower()
            if lname == b"content-length":
                self.length = int(value.strip())
            elif lname == b"transfer-encoding":
                self.chunked = b"chunked" in value.lower()
            elif lname == b"connection":
                self.upstream_closes = self.upstream_closes or b"close" in value.lower()
            if lname not in _HOP_BY_HOP:
                self.header_lines.append(line)
        if request_method == "HEAD" or self.status in (204, 304) or 100 <= self.status < 200:
            self.length, self.chunked = 0, False
        if self.chunked:
            self.length = None
        # Without a length or chunking the body ends when the upstream closes.
        self.close_delimited = self.length is None and not self.chunked

    @property
    def upstream_reusable(self) -> bool:
        return not self.close_delimited and not self.upstream_closes

    def client_head(self, close: bool) -> bytes:
        lines = [self.status_line, *self.header_lines]
        if close:
            lines.append(b"Connection: close")
        return b"\r\n".join(lines) + b"\r\n\r\n"


class _BrokenBody(ConnectionError):
    """The sending side closed, reset or garbled the framing in the middle of a body."""


class _Upstream:
    """One upstream connection, owned by one client connection (so keep-alive on both)."""

    def __init__(self, host: str, port: int, stats: _Stats) -> None:
        self._host, self._port, self._stats = host, port, stats
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None
        self.last_used = 0.0

    async def connect(
        self, loop: asyncio.AbstractEventLoop
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        if self.writer is not None and (
            self.writer.is_closing()
            or (self.reader is not None and self.reader.at_eof())
            or loop.time() - self.last_used > _UPSTREAM_MAX_IDLE_S
        ):
            self.close()
        if self.reader is None or self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(
                self._host, self._port, limit=_CHUNK
            )
            _set_nodelay(self.writer)
            self._stats.upstream_connections_total += 1
        self.last_used = loop.time()
        return self.reader, self.writer

    def close(self) -> None:
        if self.writer is not None:
            self.writer.transport.abort()
        self.reader = self.writer = None


def _set_nodelay(writer: asyncio.StreamWriter) -> None:
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


class _Client:
    """The client side of one connection: paced, counted writes and the two ways to end."""

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        stats: _Stats,
        bandwidth_bytes_per_s: float | None,
    ) -> None:
        self.reader, self.writer, self._stats = reader, writer, stats
        self._rate = bandwidth_bytes_per_s
        # Pace in slices of ~20 ms of transfer so the cap is smooth, not bursty.
        self._slice = _CHUNK if self._rate is None else max(1024, int(self._rate / 50))
        self._next_free = 0.0
        self.closed = False

    async def send(self, data: bytes, *, counted: bool = True) -> None:
        """Write paced by the bandwidth cap; ``counted=False`` for the proxy's own replies."""
        if self._rate is None or not counted:
            self.writer.write(data)
            if counted:
                self._stats.bytes_sent += len(data)
            await self.writer.drain()
            return
        loop = asyncio.get_running_loop()
        view = memoryview(data)
        for start in range(0, len(view), self._slice):
            piece = view[start : start + self._slice]
            self.writer.write(piece)
            self._stats.bytes_sent += len(piece)
            await self.writer.drain()
            now = loop.time()
            self._next_free = max(now, self._next_free) + len(piece) / self._rate
            if self._next_free - now > 0.001:
                await asyncio.sleep(self._next_free - now)

    async def reset(self) -> None:
        """Abort with a TCP RST, after what was sent so far reached the peer's kernel."""
        if self.closed:
            return
        self.closed = True
        sock = self.writer.get_extra_info("socket")
        if sock is not None:
            await _wait_send_queue_empty(sock)
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.writer.transport.abort()

    async def close(self) -> None:
        """Close cleanly (FIN)."""
        if self.closed:
            return
        self.closed = True
        self.writer.close()
        # Bounded: a peer that stopped reading must not pin this handler forever.
        with contextlib.suppress(OSError, asyncio.TimeoutError):
            await asyncio.wait_for(self.writer.wait_closed(), 5.0)


async def _wait_send_queue_empty(sock: Any, timeout: float = 1.0) -> None:
    # With SO_LINGER 0 the kernel drops unsent data at close; wait until the peer has
    # acknowledged it so that "reset mid-body" really delivers the first half.
    try:
        fd = sock.fileno()
    except (OSError, AttributeError):
        return
    buf = bytearray(4)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            fcntl.ioctl(fd, termios.TIOCOUTQ, buf)
        except OSError:
            return
        if struct.unpack("i", buf)[0] == 0:
            return
        await asyncio.sleep(0.001)


def _error_body(code: str, message: str, resource: str) -> bytes:
    request_id = hashlib.blake2b(f"{time.time_ns()}{resource}".encode(), digest_size=8)
    return (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        f"<Error><Code>{code}</Code><Message>{xml_escape(message)}</Message>"
        f"<Resource>{xml_escape(resource)}</Resource>"
        f"<RequestId>{request_id.hexdigest().upper()}</RequestId></Error>"
    ).encode()


def _simple_response(
    status: int, reason: str, body: bytes, content_type: str, close: bool
) -> bytes:
    lines = [
        f"HTTP/1.1 {status} {reason}",
        f"Content-Type: {content_type}",
        f"Content-Length: {len(body)}",
        "Server: concurrent-loader-proxy",
    ]
    if close:
        lines.append("Connection: close")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


class ProxyServer:
    """The asyncio proxy. Use it inside a running loop; normally run via the CLI."""

    def __init__(
        self,
        upstream: str,
        *,
        latency_ms: float = 0.0,
        jitter_ms: float = 0.0,
        bandwidth_bytes_per_s: float | None = None,
        faults: FaultPlan | None = None,
    ) -> None:
        self._upstream_host, self._upstream_port = _parse_upstream(upstream)
        _check_shaping(latency_ms, jitter_ms, bandwidth_bytes_per_s)
        self._latency_s = latency_ms / 1000.0
        self._jitter_s = jitter_ms / 1000.0
        self._bandwidth = bandwidth_bytes_per_s
        self._faults = faults or FaultPlan()
        # Only needed (and only paid for) when a draw depends on it.
        self._track_history = self._faults.any_faults or jitter_ms > 0
        self._history: dict[int, int] = {}
        self.stats = _Stats()
        self._server: asyncio.AbstractServer | None = None
        self._tasks: set[asyncio.Task[Any]] = set()

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> int:
        """Listen and return the bound port."""
        self._server = await asyncio.start_server(
            self._serve_client, host, port, limit=_HEAD_LIMIT, backlog=1024
        )
        return int(self._server.sockets[0].getsockname()[1])

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        # Cancel the connections first: wait_closed() waits for them, and keep-alive clients
        # would hold it open until they hang up.
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()

    # -- one client connection ---------------------------------------------------------

    async def _serve_client(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        task = asyncio.current_task()
        assert task is not None  # always inside a task when called by start_server
        self._tasks.add(task)
        _set_nodelay(writer)
        client = _Client(reader, writer, self.stats, self._bandwidth)
        upstream = _Upstream(self._upstream_host, self._upstream_port, self.stats)
        self.stats.client_connections += 1
        self.stats.client_connections_total += 1
        loop = asyncio.get_running_loop()
        try:
            while not client.closed:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except asyncio.IncompleteReadError:
                    break  # the client closed between requests
                except asyncio.LimitOverrunError:
                    await client.send(
                        _simple_response(
                            431, "Request Header Fields Too Large", b"", "text/plain", close=True
                        ),
                        counted=False,
                    )
                    break
                try:
                    request = _Request(head, loop.time())
                except ValueError as exc:
                    body = str(exc).encode()
                    await client.send(
                        _simple_response(400, "Bad Request", body, "text/plain", close=True),
                        counted=False,
                    )
                    break
                path = request.target.split("?", 1)[0]
                if path in (STATS_PATH, RESET_PATH):
                    if not await self._control(request, client):
                        break
                    continue
                self.stats.inflight += 1
                self.stats.max_inflight = max(self.stats.max_inflight, self.stats.inflight)
                try:
                    keep_alive = await self._proxy_one(request, client, upstream)
                finally:
                    self.stats.inflight -= 1
                if not keep_alive:
                    break
        except (ConnectionError, OSError) as exc:
            logger.debug("client connection ended: %r", exc)
        except Exception:
            # One broken exchange must not take the proxy down; drop just this connection.
            logger.exception("unexpected error on a client connection")
        finally:
            self.stats.client_connections -= 1
            upstream.close()
            if not client.closed:
                client.closed = True
                writer.close()
            self._tasks.discard(task)

    async def _control(self, request: _Request, client: _Client) -> bool:
        await self._discard_body(request, client)
        path = request.target.split("?", 1)[0]
        close = not request.keep_alive
        if path == STATS_PATH and request.method == "GET":
            body = json.dumps(self.stats.to_dict()).encode()
            reply = _simple_response(200, "OK", body, "application/json", close)
        elif path == RESET_PATH and request.method == "POST":
            self.stats.reset()
            self._history.clear()
            reply = _simple_response(200, "OK", b"{}", "application/json", close)
        else:
            reply = _simple_response(405, "Method Not Allowed", b"", "text/plain", close)
        await client.send(reply, counted=False)
        return request.keep_alive

    # -- one request -------------------------------------------------------------------

    def _decide(self, request: _Request) -> tuple[str | None, float]:
        """The fault for this request and the delay before its first byte, in seconds."""
        n = 0
        if self._track_history:
            key = hash((request.method, request.target))
            n = self._history.get(key, 0)
            self._history[key] = n + 1
        fault = self._faults.fault_for(request.method, request.target, n)
        delay = self._latency_s
        if self._jitter_s > 0:
            _, jitter_draw = _draws(self._faults.seed, request.method, request.target, n)
            delay += self._jitter_s * (2.0 * jitter_draw - 1.0)
        if fault == "slow":
            delay += self._faults.extra_latency_ms / 1000.0
        return fault, max(0.0, delay)

    async def _hold_first_byte(self, request: _Request, delay: float) -> None:
        wait = request.arrival + delay - asyncio.get_running_loop().time()
        if wait > 0:
            await asyncio.sleep(wait)

    async def _proxy_one(self, request: _Request, client: _Client, upstream: _Upstream) -> bool:
        """Serve one request; returns whether the client connection stays open."""
        self.stats.requests += 1
        self.stats.requests_by_method[request.method] += 1
        fault, delay = self._decide(request)
        if fault is not None:
            self.stats.faults[fault] += 1
            logger.debug("fault %s for %s %s", fault, request.method, request.target)

        if fault in ("slowdown_503", "error_500", "reset_before"):
            # Like a front end that rejects early: the upstream never sees the request.
            if not request.expects_continue:
                await self._discard_body(request, client)
            await self._hold_first_byte(request, delay)
            if fault == "reset_before":
                await client.reset()
                return False
            # A client waiting for 100 Continue may or may not send its body: close.
            close = request.expects_continue or not request.keep_alive
            if fault == "slowdown_503":
                status, reason, code, message = (
                    503,
                    "Slow Down",
                    "SlowDown",
                    "Please reduce your request rate.",
                )
            else:
                status, reason, code, message = (
                    500,
                    "Internal Server Error",
                    "InternalError",
                    "We encountered an internal error. Please try again.",
                )
            body = _error_body(code, message, request.target.split("?", 1)[0])
            self.stats.responses_by_status[str(status)] += 1
            await client.send(_simple_response(status, reason, body, "application/xml", close))
            if close:
                await client.close()
            return not close

        try:
            response = await self._send_upstream(request, client, upstream)
        except (
            ConnectionError,
            OSError,
            asyncio.IncompleteReadError,
            asyncio.LimitOverrunError,
            ValueError,
        ) as exc:
            self.stats.upstream_errors += 1
            logger.warning("upstream failed for %s %s: %r", request.method, request.target, exc)
            upstream.close()
            self.stats.responses_by_status["502"] += 1
            body = _error_body("BadGateway", f"upstream failed: {exc!r}", request.target)
            await self._hold_first_byte(request, delay)
            await client.send(
                _simple_response(502, "Bad Gateway", body, "application/xml", close=True)
            )
            await client.close()
            return False

        self.stats.responses_by_status[str(response.status)] += 1
        close = not request.keep_alive or response.close_delimited
        await self._hold_first_byte(request, delay)
        await client.send(response.client_head(close))
        assert upstream.reader is not None  # _send_upstream connected it
        if fault == "stall":
            upstream.close()
            await self._stall(client)
            return False
        cut_after = None
        if fault in ("reset_mid_body", "truncate"):
            cut_after = (response.length // 2) if response.length is not None else 1
        try:
            complete = await self._relay_body(response, upstream.reader, client, cut_after)
        except _BrokenBody as exc:
            # The upstream broke mid-body: the client must see a broken response too.
            self.stats.upstream_errors += 1
            logger.warning("upstream closed mid-body for %s: %r", request.target, exc)
            upstream.close()
            await client.reset()
            return False
        if not complete:
            upstream.close()
            if fault == "reset_mid_body":
                await client.reset()
            else:
                await client.close()
            return False
        if not response.upstream_reusable:
            upstream.close()
        if close:
            await client.close()
        return not close

    async def _send_upstream(
        self, request: _Request, client: _Client, upstream: _Upstream
    ) -> _Response:
        loop = asyncio.get_running_loop()
        # A kept-alive upstream connection may have been closed by the server just now;
        # retry once on a fresh one, but only when no request body had to be consumed.
        attempts = 1 if request.has_body else 2
        for attempt in range(attempts):
            reader, writer = await upstream.connect(loop)
            try:
                writer.write(request.upstream_head())
                if request.has_body:
                    if request.expects_continue:
                        # Expect is hop-by-hop: answer it here and stream the body on.
                        await client.send(b"HTTP/1.1 100 Continue\r\n\r\n")
                    await self._pump_request_body(request, client.reader, writer)
                await writer.drain()
                while True:
                    head = await reader.readuntil(b"\r\n\r\n")
                    response = _Response(head, request.method)
                    if not 100 <= response.status < 200:
                        return response
            except (ConnectionError, asyncio.IncompleteReadError):
                upstream.close()
                if attempt + 1 == attempts:
                    raise
        raise AssertionError("unreachable")

    async def _pump_request_body(
        self, request: _Request, src: asyncio.StreamReader, dst: asyncio.StreamWriter
    ) -> None:
        if request.chunked:
            await _relay_chunked(src, _writer_sink(dst), None)
        else:
            await _relay_fixed(src, request.content_length, _writer_sink(dst))

    async def _discard_body(self, request: _Request, client: _Client) -> None:
        if not request.has_body:
            return

        async def sink(_: bytes) -> None:
            return None

        if request.chunked:
            await _relay_chunked(client.reader, sink, None)
        else:
            await _relay_fixed(client.reader, request.content_length, sink)

    async def _relay_body(
        self,
        response: _Response,
        src: asyncio.StreamReader,
        client: _Client,
        cut_after: int | None,
    ) -> bool:
        """Relay the response body; False when it was cut on purpose after ``cut_after``."""
        if response.chunked:
            return await _relay_chunked(src, client.send, cut_after)
        if response.length is not None:
            if cut_after is None:
                await _relay_fixed(src, response.length, client.send)
                return True
            await _relay_fixed(src, cut_after, client.send)
            return cut_after >= response.length
        sent = 0
        while cut_after is None or sent < cut_after:
            data = await _read(src, _CHUNK if cut_after is None else cut_after - sent)
            if not data:
                return True
            sent += len(data)
            await client.send(data)
        return False

    async def _stall(self, client: _Client) -> None:
        # Sleep, but notice a client that gives up so its socket is not held needlessly.
        with contextlib.suppress(asyncio.TimeoutError, ConnectionError, OSError):
            await asyncio.wait_for(client.reader.read(1), self._faults.stall_seconds)
        await client.close()


def _writer_sink(writer: asyncio.StreamWriter) -> _Sink:
    async def sink(data: bytes) -> None:
        writer.write(data)
        await writer.drain()

    return sink


async def _read(src: asyncio.StreamReader, max_bytes: int) -> bytes:
    # Errors reading the source are told apart from errors writing to the sink, so a
    # broken upstream is not mistaken for a client that went away (and vice versa).
    try:
        return await src.read(max_bytes)
    except ConnectionError as exc:
        raise _BrokenBody(f"connection lost: {exc!r}") from exc


async def _read_line(src: asyncio.StreamReader) -> bytes:
    try:
        return await src.readuntil(b"\r\n")
    except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError) as exc:
        raise _BrokenBody(f"bad or missing chunk line: {exc!r}") from exc


async def _relay_fixed(src: asyncio.StreamReader, length: int, sink: _Sink) -> None:
    remaining = length
    while remaining > 0:
        data = await _read(src, min(remaining, _CHUNK))
        if not data:
            raise _BrokenBody(f"connection closed with {remaining} of {length} bytes unread")
        remaining -= len(data)
        await sink(data)


async def _relay_chunked(src: asyncio.StreamReader, sink: _Sink, cut_after: int | None) -> bool:
    """Relay one chunked body verbatim (framing included); False if cut after N bytes."""
    sent = 0
    while True:
        line = await _read_line(src)
        try:
            size = int(line.split(b";", 1)[0].strip(), 16)
        except ValueError as exc:
            raise _BrokenBody(f"bad chunk size line {line[:100]!r}") from exc
        if size == 0:
            await sink(line)
            while True:  # trailers, up to the empty line
                trailer = await _read_line(src)
                await sink(trailer)
                if trailer == b"\r\n":
                    return True
        await sink(line)
        remaining = size + 2  # chunk data and its CRLF
        while remaining > 0:
            want = min(remaining, _CHUNK)
            if cut_after is not None:
                want = min(want, max(1, cut_after - sent))
            data = await _read(src, want)
            if not data:
                raise _BrokenBody("connection closed inside a chunk")
            remaining -= len(data)
            sent += len(data)
            await sink(data)
            if cut_after is not None and sent >= cut_after:
                return False


def _parse_upstream(upstream: str) -> tuple[str, int]:
    parts = urlsplit(upstream)
    if parts.scheme != "http" or not parts.hostname:
        raise ValueError(f"upstream must be an http://host:port URL, got {upstream!r}")
    return parts.hostname, parts.port or 80


def _check_shaping(
    latency_ms: float, jitter_ms: float, bandwidth_bytes_per_s: float | None
) -> None:
    for name, value in (("latency_ms", latency_ms), ("jitter_ms", jitter_ms)):
        if not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
            raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
    if bandwidth_bytes_per_s is not None and (
        not isinstance(bandwidth_bytes_per_s, (int, float))
        or not math.isfinite(bandwidth_bytes_per_s)
        or bandwidth_bytes_per_s <= 0
    ):
        raise ValueError(
            f"bandwidth_bytes_per_s must be > 0 or None, got {bandwidth_bytes_per_s!r}"
        )


# --------------------------------------------------------------------------------------
# Command line (the proxy process).
# --------------------------------------------------------------------------------------


def parse_cpus(text: str) -> set[int]:
    cpus: set[int] = set()
    for part in text.split(","):
        first, _, last = part.partition("-")
        cpus.update(range(int(first), int(last or first) + 1))
    return cpus


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m concurrent_loader.testing.proxy",
        description="HTTP/1.1 reverse proxy adding latency, a bandwidth cap and faults "
        "in front of an S3-compatible server. Prints one JSON ready line on stdout.",
    )
    parser.add_argument("--upstream", required=True, help="http://host:port of the server")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    parser.add_argument("--latency-ms", type=float, default=0.0)
    parser.add_argument("--jitter-ms", type=float, default=0.0)
    parser.add_argument("--bandwidth-bytes-per-s", type=float, default=None)
    parser.add_argument("--seed", type=int, default=0)
    defaults = FaultPlan()
    for field in dataclasses.fields(FaultPlan):
        if field.name in ("seed", "faults_on"):
            continue
        parser.add_argument(
            "--" + field.name.replace("_", "-"), type=float, default=getattr(defaults, field.name)
        )
    parser.add_argument("--faults-on", default="GET", help="comma-separated HTTP methods")
    parser.add_argument("--cpus", type=parse_cpus, default=None, help="e.g. 0,2-3")
    parser.add_argument("--log-level", default="WARNING")
    parser.add_argument(
        "--exit-on-stdin-eof",
        action="store_true",
        help="stop when stdin closes (so the proxy dies with the process that started it)",
    )
    return parser


async def _serve(args: argparse.Namespace, plan: FaultPlan) -> None:
    proxy = ProxyServer(
        args.upstream,
        latency_ms=args.latency_ms,
        jitter_ms=args.jitter_ms,
        bandwidth_bytes_per_s=args.bandwidth_bytes_per_s,
        faults=plan,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    if args.exit_on_stdin_eof:

        def on_stdin() -> None:
            if not os.read(0, 4096):
                loop.remove_reader(0)
                stop.set()

        loop.add_reader(0, on_stdin)
    port = await proxy.start(args.host, args.port)
    ready = {
        "ready": True,
        "endpoint_url": f"http://{args.host}:{port}",
        "port": port,
        "pid": os.getpid(),
    }
    sys.stdout.write(json.dumps(ready) + "\n")
    sys.stdout.flush()
    try:
        await stop.wait()
    finally:
        await proxy.close()


def main(argv: Sequence[str] | None = None) -> int:
    """Run the proxy until SIGTERM or SIGINT."""
    args = _build_parser().parse_args(argv)
    if args.cpus:
        # Before the loop starts any thread, so every thread inherits the mask.
        os.sched_setaffinity(0, args.cpus)
    logging.basicConfig(
        level=args.log_level.upper(),
        stream=sys.stderr,
        format="%(asctime)s proxy %(levelname)s %(message)s",
    )
    fault_fields = {
        f.name: getattr(args, f.name)
        for f in dataclasses.fields(FaultPlan)
        if f.name not in ("seed", "faults_on")
    }
    try:
        plan = FaultPlan(seed=args.seed, faults_on=tuple(args.faults_on.split(",")), **fault_fields)
        _check_shaping(args.latency_ms, args.jitter_ms, args.bandwidth_bytes_per_s)
        _parse_upstream(args.upstream)
    except ValueError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return 2
    loop: asyncio.AbstractEventLoop
    try:
        import uvloop

        loop = uvloop.new_event_loop()
    except ImportError:
        loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(_serve(args, plan))
    finally:
        loop.close()
    return 0


# --------------------------------------------------------------------------------------
# Parent side: start and stop the proxy process.
# --------------------------------------------------------------------------------------


def process_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds used so far by process ``pid`` (its threads included)."""
    try:
        import psutil
    except ImportError:
        psutil = None
    if psutil is not None:
        times = psutil.Process(pid).cpu_times()
        return float(times.user + times.system)
    with open(f"/proc/{pid}/stat", "rb") as f:
        stat = f.read()
    # The command name may contain spaces and parentheses: fields start after the last ")".
    fields = stat[stat.rindex(b")") + 2 :].split()
    utime, stime = int(fields[11]), int(fields[12])
    return (utime + stime) / os.sysconf("SC_CLK_TCK")


def check_cpus(cpus: Iterable[int] | None) -> frozenset[int] | None:
    """Validate a CPU set for ``os.sched_setaffinity``; ValueError when unusable."""
    if cpus is None:
        return None
    chosen = frozenset(cpus)
    available = os.cpu_count() or 1
    if not chosen or not all(
        isinstance(c, int) and not isinstance(c, bool) and 0 <= c < available for c in chosen
    ):
        raise ValueError(
            f"cpus must be a non-empty set of CPU ids in [0, {available}), got {cpus!r}"
        )
    return chosen


def terminate_process(proc: subprocess.Popen[Any], grace_s: float) -> None:
    """SIGTERM, then SIGKILL after ``grace_s``; always reaps the child."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            proc.terminate()
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            logger.warning("pid %d ignored SIGTERM for %.1fs, killing it", proc.pid, grace_s)
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            proc.wait()


def tail_of(file: IO[bytes], max_bytes: int = 4000) -> str:
    """The last ``max_bytes`` of a log file, for error messages."""
    file.flush()
    file.seek(0, os.SEEK_END)
    size = file.tell()
    file.seek(max(0, size - max_bytes))
    return file.read().decode("utf-8", "replace")


class ProxyProcess:
    """The proxy as a child process, for tests and benchmarks.

    Lifecycle: ``start()`` (or ``with``) once, then ``stop()`` (idempotent); it cannot be
    restarted. ``start()`` returns when the proxy listens.
    """

    def __init__(
        self,
        upstream: str,
        *,
        latency_ms: float = 0.0,
        jitter_ms: float = 0.0,
        bandwidth_bytes_per_s: float | None = None,
        faults: FaultPlan | None = None,
        cpus: Iterable[int] | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        startup_timeout_s: float = 15.0,
        log_level: str = "WARNING",
    ) -> None:
        _parse_upstream(upstream)
        _check_shaping(latency_ms, jitter_ms, bandwidth_bytes_per_s)
        if faults is not None and not isinstance(faults, FaultPlan):
            raise TypeError(f"faults must be a FaultPlan, got {type(faults).__name__}")
        self.upstream = upstream
        self.latency_ms = latency_ms
        self.jitter_ms = jitter_ms
        self.bandwidth_bytes_per_s = bandwidth_bytes_per_s
        self.faults = faults or FaultPlan()
        self.cpus = check_cpus(cpus)
        self.host = host
        self._requested_port = port
        self._startup_timeout_s = startup_timeout_s
        self._log_level = log_level
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        self._port: int | None = None
        self._stopped = False

    def command(self) -> list[str]:
        """The command line that runs this proxy."""
        # Run as a script with -I: no package __init__ (and no heavy imports) on startup.
        cmd = [
            sys.executable,
            "-I",
            os.path.abspath(__file__),
            # Our end of its stdin closes when we exit, even when killed, so the proxy
            # never outlives its parent.
            "--exit-on-stdin-eof",
            "--upstream",
            self.upstream,
            "--host",
            self.host,
            "--port",
            str(self._requested_port),
            "--latency-ms",
            repr(float(self.latency_ms)),
            "--jitter-ms",
            repr(float(self.jitter_ms)),
            "--log-level",
            self._log_level,
        ]
        if self.bandwidth_bytes_per_s is not None:
            cmd += ["--bandwidth-bytes-per-s", repr(float(self.bandwidth_bytes_per_s))]
        if self.cpus is not None:
            cmd += ["--cpus", ",".join(str(c) for c in sorted(self.cpus))]
        return cmd + self.faults.to_cli_args()

    def start(self) -> ProxyProcess:
        if self._proc is not None or self._stopped:
            raise RuntimeError("a ProxyProcess can be started only once")
        # Lives as long as the process (closed in stop()), so no context manager.
        self._log = tempfile.TemporaryFile(prefix="concurrent-loader-proxy-")  # noqa: SIM115
        self._proc = subprocess.Popen(
            self.command(), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log
        )
        try:
            self._port = self._read_ready_line()
        except BaseException:
            self.stop()
            raise
        logger.debug("proxy pid %d listening at %s", self._proc.pid, self.endpoint_url)
        return self

    def _read_ready_line(self) -> int:
        assert self._proc is not None and self._proc.stdout is not None and self._log
        deadline = time.monotonic() + self._startup_timeout_s
        with selectors.DefaultSelector() as selector:
            selector.register(self._proc.stdout, selectors.EVENT_READ)
            buffer = b""
            while b"\n" not in buffer:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not selector.select(remaining):
                    raise RuntimeError(
                        f"proxy did not start within {self._startup_timeout_s}s; "
                        f"log:\n{tail_of(self._log)}"
                    )
                data = os.read(self._proc.stdout.fileno(), 4096)
                if not data:
                    self._proc.wait()
                    raise RuntimeError(
                        f"proxy exited with status {self._proc.returncode} before it was "
                        f"ready; log:\n{tail_of(self._log)}"
                    )
                buffer += data
        return int(json.loads(buffer.split(b"\n", 1)[0])["port"])

    def stop(self) -> None:
        """Stop the process (SIGTERM, SIGKILL after 5 s). Idempotent."""
        self._stopped = True
        if self._proc is not None:
            terminate_process(self._proc, grace_s=5.0)
            for pipe in (self._proc.stdin, self._proc.stdout):
                if pipe is not None:
                    pipe.close()
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> ProxyProcess:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError("proxy not started")
        return self._port

    @property
    def endpoint_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def pid(self) -> int:
        if self._proc is None:
            raise RuntimeError("proxy not started")
        return self._proc.pid

    def log_tail(self) -> str:
        """The end of the proxy's stderr log."""
        return tail_of(self._log) if self._log is not None else ""

    def cpu_seconds(self) -> float:
        """User + system CPU time the proxy process has used so far."""
        return process_cpu_seconds(self.pid)

    def _control(self, method: str, path: str) -> dict[str, Any]:
        conn = http.client.HTTPConnection(self.host, self.port, timeout=10)
        try:
            conn.request(method, path)
            response = conn.getresponse()
            body = response.read()
            if response.status != 200:
                raise RuntimeError(f"{method} {path} -> {response.status}: {body[:200]!r}")
            result: dict[str, Any] = json.loads(body)
            return result
        finally:
            conn.close()

    def stats(self) -> dict[str, Any]:
        """The proxy's counters, as served at ``/__proxy__/stats``.

        Keys: ``requests``, ``requests_by_method``, ``responses_by_status`` (str keys),
        ``faults`` (every name in ``FAULT_NAMES``), ``bytes_sent`` (heads and bodies to
        clients), ``inflight`` / ``max_inflight`` (from request arrival to last byte),
        ``client_connections`` / ``client_connections_total``,
        ``upstream_connections_total`` and ``upstream_errors``. Control requests are not
        counted, except as connections.
        """
        return self._control("GET", STATS_PATH)

    def reset_stats(self) -> None:
        """Zero the counters and forget request history (faults restart from n = 0)."""
        self._control("POST", RESET_PATH)


if __name__ == "__main__":
    sys.exit(main())
