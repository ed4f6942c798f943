"""The proxy itself: an asyncio server relaying each client connection to the upstream.

Guarantees, per request:

* Its fault (:class:`~.faults.FaultPlan`) and its latency (:class:`~.latency.LatencyModel`)
  are drawn from ``(seed, method, target, n)`` (:mod:`.draws`); ``n`` is kept per method
  and target until a reset.
* Latency is measured from the arrival of the request head to the first response byte,
  so the upstream's own time is hidden inside it rather than added to it.
* Rejections (503, 500, reset before any byte) never reach the upstream; a corrupted body
  keeps its length and framing (:mod:`.tamper`).
* ``GET /__proxy__/stats`` (JSON) and ``POST /__proxy__/reset`` (zero the counters and
  the per-request history behind ``n``) are answered here and never forwarded.
* One broken exchange never takes the proxy down: only that connection is dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from typing import Any
from urllib.parse import urlsplit

from .bandwidth import TokenBucket, check_rate
from .connections import Client, Upstream, set_nodelay
from .faults import FaultPlan
from .http import (
    BrokenBody,
    Request,
    Response,
    Sink,
    discard_body,
    error_body,
    relay_request_body,
    relay_response_body,
    simple_response,
    writer_sink,
)
from .latency import LatencyModel
from .stats import Stats
from .tamper import STRAY_RESPONSE, corrupting, trailing

__all__ = ["RESET_PATH", "STATS_PATH", "ProxyServer", "parse_upstream"]

# Named for the package: in the proxy process this module is imported as ``proxy.server``.
logger = logging.getLogger("concurrent_loader.testing.proxy")

STATS_PATH = "/__proxy__/stats"
RESET_PATH = "/__proxy__/reset"

_HEAD_LIMIT = 64 * 1024


def parse_upstream(upstream: str) -> tuple[str, int]:
    """``(host, port)`` of an ``http://host:port`` URL; ValueError for anything else."""
    parts = urlsplit(upstream)
    if parts.scheme != "http" or not parts.hostname:
        raise ValueError(f"upstream must be an http://host:port URL, got {upstream!r}")
    return parts.hostname, parts.port or 80


class ProxyServer:
    """The asyncio proxy. Use it inside a running loop; normally run via the CLI.

    The latency options and ``preset`` make a :class:`~.latency.LatencyModel` (see
    :meth:`~.latency.LatencyModel.from_options`), drawn with ``faults.seed``;
    ``bandwidth_bytes_per_s`` caps each connection and ``total_bandwidth`` all of them
    together (bytes/s sent to clients, see :mod:`.bandwidth`).
    """

    def __init__(
        self,
        upstream: str,
        *,
        latency_ms: float = 0.0,
        jitter_ms: float = 0.0,
        latency_p50_ms: float | None = None,
        latency_p99_ms: float | None = None,
        straggler_fraction: float | None = None,
        straggler_s: float | None = None,
        preset: str | None = None,
        bandwidth_bytes_per_s: float | None = None,
        total_bandwidth: float | None = None,
        faults: FaultPlan | None = None,
    ) -> None:
        self._upstream_host, self._upstream_port = parse_upstream(upstream)
        self.latency = LatencyModel.from_options(
            preset,
            latency_ms=latency_ms,
            jitter_ms=jitter_ms,
            latency_p50_ms=latency_p50_ms,
            latency_p99_ms=latency_p99_ms,
            straggler_fraction=straggler_fraction,
            straggler_s=straggler_s,
        )
        check_rate("bandwidth_bytes_per_s", bandwidth_bytes_per_s)
        check_rate("total_bandwidth", total_bandwidth)
        self._bandwidth = bandwidth_bytes_per_s
        self._total_bandwidth = None if total_bandwidth is None else TokenBucket(total_bandwidth)
        self._faults = faults or FaultPlan()
        # Only needed (and only paid for) when a draw depends on it.
        self._track_history = self._faults.any_faults or self.latency.draws_per_request
        self._history: dict[int, int] = {}
        self._first_faultable: float | None = None  # when the storm's clock started
        self.stats = Stats()
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
        set_nodelay(writer)
        client = Client(reader, writer, self.stats, self._bandwidth, self._total_bandwidth)
        upstream = Upstream(self._upstream_host, self._upstream_port, self.stats)
        self.stats.client_connections += 1
        self.stats.client_connections_total += 1
        try:
            while not client.closed:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except asyncio.IncompleteReadError:
                    break  # the client closed between requests
                except asyncio.LimitOverrunError:
                    await client.send(
                        simple_response(
                            431, "Request Header Fields Too Large", b"", "text/plain", close=True
                        ),
                        counted=False,
                    )
                    break
                try:
                    request = Request(head, time.monotonic())
                except ValueError as exc:
                    body = str(exc).encode()
                    await client.send(
                        simple_response(400, "Bad Request", body, "text/plain", close=True),
                        counted=False,
                    )
                    break
                if request.path in (STATS_PATH, RESET_PATH):
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

    async def _control(self, request: Request, client: Client) -> bool:
        await discard_body(request, client.reader)
        close = not request.keep_alive
        if request.path == STATS_PATH and request.method == "GET":
            figures = self.stats.to_dict()
            if self._first_faultable is not None:  # seconds since the storm's clock started
                figures["storm_clock_s"] = time.monotonic() - self._first_faultable
            body = json.dumps(figures).encode()
            reply = simple_response(200, "OK", body, "application/json", close)
        elif request.path == RESET_PATH and request.method == "POST":
            self.stats.reset()
            self._history.clear()
            self._first_faultable = None
            reply = simple_response(200, "OK", b"{}", "application/json", close)
        else:
            reply = simple_response(405, "Method Not Allowed", b"", "text/plain", close)
        await client.send(reply, counted=False)
        return request.keep_alive

    # -- one request -------------------------------------------------------------------

    def _decide(self, request: Request) -> tuple[str | None, float]:
        """The fault for this request and the delay before its first byte, in seconds."""
        n = 0
        if self._track_history:
            key = hash((request.method, request.target))
            n = self._history.get(key, 0)
            self._history[key] = n + 1
        seed = self._faults.seed
        fault = self._faults.fault_for(request.method, request.target, n)
        if self._faults.storm_seconds > 0 and self._faults.faultable(
            request.method, request.target
        ):
            if self._first_faultable is None:
                self._first_faultable = request.arrival
            if self._faults.in_storm(request.arrival - self._first_faultable):
                fault = "slowdown_503"
                self.stats.storm_503 += 1
        delay, straggler = self.latency.first_byte(seed, request.method, request.target, n)
        if straggler:
            self.stats.stragglers += 1
            logger.debug("straggler %s %s", request.method, request.target)
        if fault == "slow":
            delay += self._faults.extra_latency_ms / 1000.0
        return fault, max(0.0, delay)

    async def _hold_first_byte(self, request: Request, delay: float) -> None:
        # On the system's clock, not the loop's: uvloop's loop time is cached at each turn
        # and kept in milliseconds, and its timers may fire up to a millisecond before the
        # delay has passed in real time.
        deadline = request.arrival + delay
        while (wait := deadline - time.monotonic()) > 0:
            await asyncio.sleep(wait)

    async def _proxy_one(self, request: Request, client: Client, upstream: Upstream) -> bool:
        """Serve one request; returns whether the client connection stays open."""
        self.stats.requests += 1
        self.stats.requests_by_method[request.method] += 1
        fault, delay = self._decide(request)
        if fault is not None:
            self.stats.faults[fault] += 1
            logger.debug("fault %s for %s %s", fault, request.method, request.target)

        if fault in ("slowdown_503", "error_500", "reset_before"):
            return await self._reject(request, client, fault, delay)

        if fault == "ignore_range":
            request.drop_header(b"range")
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
            body = error_body("BadGateway", f"upstream failed: {exc!r}", request.target)
            await self._hold_first_byte(request, delay)
            await client.send(
                simple_response(502, "Bad Gateway", body, "application/xml", close=True)
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
        sink: Sink = client.send
        if fault == "corrupt" and 200 <= response.status < 300 and response.length:
            sink = corrupting(client.send, response.length // 2)
        stray = STRAY_RESPONSE if fault == "stray_bytes" else b""
        if stray and response.length:
            sink, stray = trailing(client.send, response.length, stray), b""
        try:
            complete = await relay_response_body(response, upstream.reader, sink, cut_after)
        except BrokenBody as exc:
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
        if stray:  # a body of no length, or chunked: after it
            await client.send(stray, counted=False)
        if close:
            await client.close()
        return not close

    async def _reject(self, request: Request, client: Client, fault: str, delay: float) -> bool:
        """Answer a 503/500 or reset fault; returns whether the client connection stays open."""
        # Like a front end that rejects early: the upstream never sees the request.
        if not request.expects_continue:
            await discard_body(request, client.reader)
        await self._hold_first_byte(request, delay)
        if fault == "reset_before":
            await client.reset()
            return False
        # A client waiting for 100 Continue may or may not send its body: close.
        close = request.expects_continue or not request.keep_alive
        extra: tuple[str, ...] = ()
        if fault == "slowdown_503":
            status, reason, code, message = (
                503,
                "Slow Down",
                self._faults.throttle_code,
                "Please reduce your request rate.",
            )
            if self._faults.retry_after_s > 0:
                extra = (f"Retry-After: {self._faults.retry_after_s:g}",)
        else:
            status, reason, code, message = (
                500,
                "Internal Server Error",
                "InternalError",
                "We encountered an internal error. Please try again.",
            )
        body = error_body(code, message, request.path)
        self.stats.responses_by_status[str(status)] += 1
        await client.send(simple_response(status, reason, body, "application/xml", close, extra))
        if close:
            await client.close()
        return not close

    async def _send_upstream(
        self, request: Request, client: Client, upstream: Upstream
    ) -> Response:
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
                    await relay_request_body(request, client.reader, writer_sink(writer))
                await writer.drain()
                while True:
                    head = await reader.readuntil(b"\r\n\r\n")
                    response = Response(head, request.method)
                    if not 100 <= response.status < 200:
                        return response
            except (ConnectionError, asyncio.IncompleteReadError):
                upstream.close()
                if attempt + 1 == attempts:
                    raise
        raise AssertionError("unreachable")

    async def _stall(self, client: Client) -> None:
        # Sleep, but notice a client that gives up so its socket is not held needlessly.
        with contextlib.suppress(asyncio.TimeoutError, ConnectionError, OSError):
            await asyncio.wait_for(client.reader.read(1), self._faults.stall_seconds)
        await client.close()
