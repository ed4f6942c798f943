"""The transport: a bounded pool of keep-alive HTTP/1.1 connections, bound to the event loop
it is first used on. Beyond the transport contract (:mod:`concurrent_loader.transport`):
``max_connections`` bounds connections open or opening over all origins (a newcomer never
overtakes a queued caller); an idle connection of another origin is closed to make room; a
request that fails before any response byte on a *reused* connection is retried once on a
fresh one, and nothing else is retried.
"""

from __future__ import annotations

import asyncio
import collections
import ssl
import warnings
from collections.abc import Sequence

from concurrent_loader.config import Timeouts, check_count
from concurrent_loader.errors import ConnectionFailed

from .connection import Connection, Key
from .errors import connect_error
from .origin import Origin
from .proxy import Proxy
from .reader import DigestFor, Response
from .request import build_request
from .sockets import connect_socket

__all__ = ["ConnectionPool"]

_DEFAULT_TIMEOUTS = Timeouts()


class ConnectionPool:
    """Keep-alive HTTP/1.1 connections for GETs, bounded in number. ``url`` labels errors
    only (``s3://bucket/key``): never put credentials in it."""

    def __init__(
        self,
        *,
        max_connections: int = 256,
        timeouts: Timeouts = _DEFAULT_TIMEOUTS,
        ssl_context: ssl.SSLContext | None = None,
        proxy: Proxy | None = None,
    ) -> None:
        # Set before validating: __del__ runs even when __init__ raises.
        self._closed = False
        self._connections: set[Connection] = set()
        check_count("max_connections", max_connections)
        self.max_connections = max_connections
        self.timeouts = timeouts
        self._ssl_context = ssl_context
        self._proxy = proxy
        self._idle: dict[Key, list[Connection]] = {}
        self._idle_count = 0
        self._open_count = 0  # connections open or being opened; each holds one slot
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()
        self._lost_futures: list[asyncio.Future[None]] = []

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"{self._open_count}/{self.max_connections} open"
        return f"<ConnectionPool {state}, {self._idle_count} idle>"

    async def __aenter__(self) -> ConnectionPool:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    def __del__(self) -> None:
        if not self._closed and self._connections:
            warnings.warn(f"unclosed {self!r}", ResourceWarning, source=self, stacklevel=1)

    @property
    def closed(self) -> bool:
        return self._closed

    async def get(
        self,
        origin: Origin,
        target: str,
        headers: Sequence[tuple[str, str]],
        *,
        url: str,
        max_bytes: int | None = None,
        byte_range: tuple[int, int] | None = None,
        digest_for: DigestFor | None = None,
    ) -> Response:
        """GET ``target`` from ``origin`` and return the whole response (any status);
        ``digest_for`` picks, per response, what reads its body as it arrives."""
        if self._closed:
            raise RuntimeError("pool is closed")
        proxy = self._proxy
        if proxy is not None and not origin.tls:
            # A plain-HTTP origin is asked through the proxy in absolute form.
            request = build_request(
                target,
                origin.host_header,
                [*headers, *proxy.headers()],
                byte_range,
                absolute_prefix=f"http://{origin.host_header}",
            )
        else:
            request = build_request(target, origin.host_header, headers, byte_range)
        # A tuple, not the Origin: hashing a dataclass runs Python code.
        key = (origin.host, origin.port, origin.tls)

        # With callers queued, a newcomer queues too (FIFO).
        conn = None if self._waiters else self._pop_idle(key)
        if conn is None:
            conn = await self._acquire(key, url)
        while True:
            # A retry on a fresh connection calls digest_for again: no digest saw a byte yet.
            waiter = conn.start(request, url, max_bytes, byte_range, digest_for)
            try:
                return await waiter
            except ConnectionFailed:
                if conn.served == 0 or conn.started or self._closed:
                    raise
                # Closed while idle: the GET never reached the server; a fresh connection
                # (served == 0) is never retried again.
                conn = await self._acquire(key, url, allow_idle=False)
            except BaseException:
                if conn.waiter is waiter:
                    conn.abandon()
                raise

    async def close(self) -> None:
        """Close every connection and wait until their sockets are closed. Idempotent."""
        self._closed = True
        for conn in list(self._connections):
            if conn.transport is not None:
                self._lost_futures.append(conn.lost_future)
            conn.fail(RuntimeError("pool is closed"))
        self._idle.clear()
        self._idle_count = 0
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
        lost = [f for f in self._lost_futures if not f.done()]
        if lost:
            await asyncio.wait(lost)
        self._lost_futures.clear()

    # -- what connections tell the pool (ConnectionOwner) --------------------------------

    def connection_idle(self, conn: Connection) -> None:
        if self._closed:
            conn.discard()
            return
        conn.in_idle = True
        self._idle.setdefault(conn.key, []).append(conn)
        self._idle_count += 1
        self._wake_one()

    def connection_released(self, conn: Connection) -> None:
        if conn.in_idle:
            conn.in_idle = False
            self._idle[conn.key].remove(conn)
            self._idle_count -= 1
        if conn.holds_slot:
            conn.holds_slot = False
            self._open_count -= 1
            self._connections.discard(conn)
            self._wake_one()

    # -- slots and idle connections -----------------------------------------------------

    def _pop_idle(self, key: Key) -> Connection | None:
        stack = self._idle.get(key)
        while stack:
            # Most recently used first: the warmest connection, the least likely timed out.
            conn = stack.pop()
            self._idle_count -= 1
            conn.in_idle = False
            if conn.reusable():
                return conn
            conn.discard()
        return None

    def _evict_idle(self) -> bool:
        """Close the least recently used idle connection of any origin, freeing a slot."""
        for stack in self._idle.values():
            if stack:
                stack[0].discard()
                return True
        return False

    def _wake_one(self) -> None:
        waiters = self._waiters
        while waiters:
            waiter = waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    async def _acquire(self, key: Key, url: str, *, allow_idle: bool = True) -> Connection:
        """An idle connection to ``key`` if allowed, else a new one once a slot is free."""
        woken = False
        loop = asyncio.get_running_loop()
        while True:
            if self._closed:
                raise RuntimeError("pool is closed")
            if allow_idle and (woken or not self._waiters):
                conn = self._pop_idle(key)
                if conn is not None:
                    return conn
            if (woken or not self._waiters) and (
                self._open_count < self.max_connections or self._evict_idle()
            ):
                return await self._connect(key, url, loop)
            waiter: asyncio.Future[None] = loop.create_future()
            if woken:
                self._waiters.appendleft(waiter)  # keep our place in the queue
            else:
                self._waiters.append(waiter)
            try:
                await waiter
            except BaseException:
                if waiter.done() and not waiter.cancelled():
                    self._wake_one()  # we were woken but will not use it: pass it on
                raise
            woken = True

    async def _connect(self, key: Key, url: str, loop: asyncio.AbstractEventLoop) -> Connection:
        host, port, tls = key
        conn = Connection(self, key, loop, self.timeouts)
        self._open_count += 1
        self._connections.add(conn)
        ssl_context: ssl.SSLContext | None = None
        if tls:
            if self._ssl_context is None:
                # Built on first TLS use only: loading the CA store takes milliseconds.
                self._ssl_context = ssl.create_default_context()
            ssl_context = self._ssl_context
        try:
            await asyncio.wait_for(
                self._open(conn, host, port, tls, ssl_context, url, loop), self.timeouts.connect
            )
        except (OSError, TimeoutError) as exc:
            conn.discard()
            raise connect_error(exc, url, self.timeouts.connect) from exc
        except BaseException:
            conn.discard()
            raise
        if self._closed:
            conn.discard()
            raise RuntimeError("pool is closed")
        return conn

    async def _open(
        self,
        conn: Connection,
        host: str,
        port: int,
        tls: bool,
        ssl_context: ssl.SSLContext | None,
        url: str,
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        """Connect ``conn``, directly or through the proxy (a CONNECT tunnel for https)."""
        proxy = self._proxy
        if proxy is None:
            sock = await connect_socket(host, port)
        elif not tls:
            sock = await connect_socket(proxy.origin.host, proxy.origin.port)
        else:
            sock = await proxy.open_tunnel(Origin("https", host, port), url)
        try:
            await loop.create_connection(
                lambda: conn, sock=sock, ssl=ssl_context, server_hostname=host if tls else None
            )
        except BaseException:
            sock.close()
            raise
