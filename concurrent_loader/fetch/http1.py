"""A lean asyncio HTTP/1.1 client for the GET of every object.

General clients (aiohttp, botocore) spend several times the CPU of the transfer itself on
each small GET. :class:`ConnectionPool` does only what a whole-object GET needs, on
:class:`asyncio.BufferedProtocol` so that the kernel copies a ``Content-Length`` body
straight into the one ``bytearray`` the caller receives. It guarantees:

* keep-alive connections are pooled per ``(scheme, host, port)``, with at most
  ``max_connections`` open or opening in total; callers beyond that wait in FIFO order and
  are woken when a connection is released, never by polling;
* a connection goes back to the pool only after its response was read to the end and the
  server did not ask to close it; any other connection is closed, its slot released;
* a request that fails before any response byte on a *reused* connection (the server
  closed it while idle) is retried once on a fresh connection; nothing is retried after a
  response byte arrived;
* transport failures raise the :mod:`concurrent_loader.errors` tree with ``stage="fetch"``:
  :class:`~concurrent_loader.errors.ConnectionFailed`,
  :class:`~concurrent_loader.errors.IncompleteBody`,
  :class:`~concurrent_loader.errors.FetchTimeout` (connect, first byte, or a read stall),
  :class:`~concurrent_loader.errors.ObjectTooLarge`. Non-2xx statuses are returned, not
  raised: the caller maps them and may need the body (S3's XML error);
* cancelling :meth:`ConnectionPool.get` closes its connection and frees its slot;
  :meth:`ConnectionPool.close` closes every socket before returning.

It works on the default asyncio loop and on uvloop, over plain TCP and TLS. A pool belongs
to the event loop it is first used on.
"""

from __future__ import annotations

import asyncio
import collections
import ssl
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

from concurrent_loader.config import Timeouts
from concurrent_loader.errors import (
    ConfigError,
    ConnectionFailed,
    FetchTimeout,
    IncompleteBody,
    ObjectTooLarge,
    Reason,
)

__all__ = ["ConnectionPool", "Response", "Timeouts"]

_Key = tuple[str, int, bool]  # (host, port, tls)

_DEFAULT_PORTS = {"http": 80, "https": 443}
# Big enough for any S3 response head plus the first slice of the body; the rest of a
# Content-Length body goes straight into its final buffer.
_HEAD_BUFFER_BYTES = 16 * 1024
_MAX_HEAD_BYTES = 256 * 1024
_SCRATCH_BYTES = 64 * 1024
_MAX_CHUNK_LINE = 4096

# Connection states.
_IDLE = 0  # no request in flight (pooled, or being handed out)
_HEAD = 1  # waiting for / reading the status line and headers
_LENGTH = 2  # reading a Content-Length body into its final buffer
_CHUNKED = 3  # reading a Transfer-Encoding: chunked body
_UNTIL_CLOSE = 4  # reading a body delimited by the end of the connection
_DEAD = 5  # closed or failed; never reused

# Chunked-decoder states.
_CHUNK_SIZE = 0
_CHUNK_DATA = 1
_CHUNK_END = 2
_CHUNK_TRAILER = 3

# asyncio.wait_for raises asyncio.TimeoutError, a distinct class before Python 3.11.
_TIMEOUT_ERRORS = (TimeoutError, getattr(asyncio, "TimeoutError", TimeoutError))
_DEFAULT_TIMEOUTS = Timeouts()

_NO_BODY = bytearray()
_NO_VIEW = memoryview(_NO_BODY)


@dataclass(slots=True)
class Response:
    """One HTTP response, read to the end. ``headers`` names are lower-case; repeated
    headers are joined with ``", "``."""

    status: int
    headers: dict[str, str]
    body: bytearray | bytes
    #: seconds from the request's send to the first byte of the response
    first_byte_s: float = 0.0


def _malformed(url: str, detail: str) -> ConnectionFailed:
    return ConnectionFailed(detail, url=url, stage="fetch", cause=Reason.MALFORMED_RESPONSE)


class _Connection(asyncio.BufferedProtocol):
    """One keep-alive connection and the parser of the response in flight on it.

    The response state lives here, not in a task: the transport calls ``get_buffer`` and
    ``buffer_updated`` directly, and the request's future is resolved from those callbacks,
    so a GET costs one future and no extra task switches.
    """

    __slots__ = (
        "body",
        "body_view",
        "chunk_left",
        "chunk_state",
        "expected",
        "first_byte_at",
        "got",
        "head",
        "head_len",
        "head_view",
        "headers",
        "holds_slot",
        "in_idle",
        "keep_alive",
        "key",
        "last_data",
        "loop",
        "lost",
        "lost_future",
        "max_bytes",
        "pool",
        "raw",
        "scratch",
        "sent_at",
        "served",
        "started",
        "state",
        "status",
        "timeouts",
        "timer",
        "transport",
        "url",
        "waiter",
    )

    def __init__(
        self, pool: ConnectionPool, key: _Key, loop: asyncio.AbstractEventLoop, timeouts: Timeouts
    ) -> None:
        self.pool = pool
        self.key = key
        self.loop = loop
        self.timeouts = timeouts
        self.transport: asyncio.Transport | None = None
        self.lost = False
        self.lost_future: asyncio.Future[None] = loop.create_future()
        self.holds_slot = True  # every connection owns one of the pool's slots until released
        self.in_idle = False
        self.served = 0  # responses completed on this connection
        self.state = _IDLE
        self.waiter: asyncio.Future[Response] | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.url = ""
        self.max_bytes: int | None = None
        self.started = False
        self.sent_at = 0.0
        self.last_data = 0.0
        self.first_byte_at = 0.0
        self.head = bytearray(_HEAD_BUFFER_BYTES)
        self.head_view = memoryview(self.head)
        self.head_len = 0
        self.status = 0
        self.headers: dict[str, str] = {}
        self.keep_alive = False
        self.body = _NO_BODY
        self.body_view = _NO_VIEW
        self.got = 0
        self.expected = 0
        # Reading chunked or until-close bodies needs a scratch buffer: made on first use,
        # since most connections only ever see Content-Length bodies.
        self.scratch = _NO_VIEW
        self.raw = bytearray()
        self.chunk_state = _CHUNK_SIZE
        self.chunk_left = 0

    # -- asyncio protocol callbacks -----------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)

    def get_buffer(self, sizehint: int) -> memoryview:
        state = self.state
        if state == _LENGTH:
            # The kernel writes the body straight into its final buffer.
            return self.body_view[self.got :]
        if state == _HEAD:
            if self.head_len == len(self.head):
                bigger = bytearray(2 * len(self.head))
                bigger[: self.head_len] = self.head
                self.head = bigger
                self.head_view = memoryview(bigger)
            return self.head_view[self.head_len :]
        if not self.scratch:
            self.scratch = memoryview(bytearray(_SCRATCH_BYTES))
        return self.scratch

    def buffer_updated(self, nbytes: int) -> None:
        state = self.state
        self.last_data = self.loop.time()
        if state == _LENGTH:
            self.got += nbytes
            if self.got >= self.expected:
                self._complete()
            return
        if state == _HEAD:
            if not self.started:
                self.first_byte_at = self.last_data
            self.started = True
            search_from = self.head_len - 3 if self.head_len > 3 else 0
            self.head_len += nbytes
            self._parse_head(search_from)
            return
        if state == _CHUNKED:
            self.raw += self.scratch[:nbytes]
            self._parse_chunks()
        elif state == _UNTIL_CLOSE:
            self.body += self.scratch[:nbytes]
            self._check_growing_body()
        else:
            # Bytes nobody asked for (a response without a request): the framing is lost.
            self._discard()

    def eof_received(self) -> bool:
        # Returning False lets the transport close; connection_lost decides what the EOF
        # means for the response in flight.
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        if not self.lost_future.done():
            self.lost_future.set_result(None)
        state = self.state
        if state == _IDLE:
            self.state = _DEAD
            self.pool._release(self)
            return
        if state == _DEAD:
            self.pool._release(self)
            return
        if state == _UNTIL_CLOSE and exc is None:
            self._complete()
            return
        error: ConnectionFailed | IncompleteBody
        how = "closed" if exc is None else "reset"
        reason = Reason.CONNECTION_CLOSED if exc is None else Reason.CONNECTION_RESET
        if not self.started:
            error = ConnectionFailed(
                f"connection {how} before any response byte",
                url=self.url,
                stage="fetch",
                cause=reason,
            )
        elif state == _LENGTH and exc is None:
            error = IncompleteBody(
                f"got {self.got} of {self.expected} bytes",
                url=self.url,
                stage="fetch",
                cause=Reason.INCOMPLETE_BODY,
            )
        elif state == _CHUNKED and exc is None:
            error = IncompleteBody(
                f"chunked body ended after {len(self.body)} bytes, before its last chunk",
                url=self.url,
                stage="fetch",
                cause=Reason.INCOMPLETE_BODY,
            )
        elif state == _HEAD:
            error = ConnectionFailed(
                f"connection {how} inside the response headers",
                url=self.url,
                stage="fetch",
                cause=reason,
            )
        else:
            progress = f"{self.got} of {self.expected}" if state == _LENGTH else f"{len(self.body)}"
            error = ConnectionFailed(
                f"connection {how} after {progress} body bytes",
                url=self.url,
                stage="fetch",
                cause=reason,
            )
        error.__cause__ = exc
        self._fail(error)

    # -- requests ---------------------------------------------------------------------

    def start(self, request: bytes, url: str, max_bytes: int | None) -> asyncio.Future[Response]:
        """Send ``request`` and return the future of its response."""
        loop = self.loop
        waiter: asyncio.Future[Response] = loop.create_future()
        self.waiter = waiter
        self.url = url
        self.max_bytes = max_bytes
        self.state = _HEAD
        self.started = False
        self.head_len = 0
        transport = self.transport
        if self.lost or transport is None or transport.is_closing():
            # The server closed it between connect (or the pool) and now. asyncio would
            # drop the write silently and uvloop would raise: fail it like a closed
            # connection instead, which the pool retries when it was a reused one.
            self._fail_unsent(None)
            return waiter
        now = loop.time()
        self.sent_at = now
        timeouts = self.timeouts
        # One timer per request, armed for the earlier deadline; it re-arms itself rather
        # than being rescheduled on every chunk (see _on_timer).
        self.timer = loop.call_at(now + min(timeouts.first_byte, timeouts.read), self._on_timer)
        try:
            transport.write(request)
        except (RuntimeError, OSError) as exc:
            self._fail_unsent(exc)
        return waiter

    def _fail_unsent(self, exc: BaseException | None) -> None:
        error = ConnectionFailed(
            "connection closed before the request was sent",
            url=self.url,
            stage="fetch",
            cause=Reason.CONNECTION_CLOSED,
        )
        error.__cause__ = exc
        self._fail(error)

    def abandon(self) -> None:
        """Give up the request in flight (its caller was cancelled): close, free the slot."""
        self.waiter = None
        self._discard()

    def shutdown(self, error: BaseException) -> None:
        """Close now, failing any request in flight with ``error``."""
        waiter = self.waiter
        self.waiter = None
        self._discard()
        if waiter is not None and not waiter.done():
            waiter.set_exception(error)

    def _on_timer(self) -> None:
        if self.waiter is None or self.state in (_IDLE, _DEAD):
            return
        timeouts = self.timeouts
        now = self.loop.time()
        if not self.started:
            remaining = self.sent_at + timeouts.first_byte - now
            if remaining <= 0:
                self._fail(
                    FetchTimeout(
                        f"no response byte within {timeouts.first_byte:g} s",
                        url=self.url,
                        stage="fetch",
                        cause=Reason.FIRST_BYTE_TIMEOUT,
                    )
                )
                return
        else:
            remaining = self.last_data + timeouts.read - now
            if remaining <= 0:
                self._fail(
                    FetchTimeout(
                        f"no data for {timeouts.read:g} s",
                        url=self.url,
                        stage="fetch",
                        cause=Reason.READ_TIMEOUT,
                    )
                )
                return
        self.timer = self.loop.call_at(now + remaining, self._on_timer)

    # -- parsing ----------------------------------------------------------------------

    def _parse_head(self, search_from: int) -> None:
        head = self.head
        end = head.find(b"\r\n\r\n", search_from, self.head_len)
        if end < 0:
            if self.head_len >= _MAX_HEAD_BYTES:
                self._fail(_malformed(self.url, f"response headers over {_MAX_HEAD_BYTES} bytes"))
            return
        lines = head[:end].decode("latin-1").split("\r\n")
        version, _, rest = lines[0].partition(" ")
        status_text = rest[:3]
        if (
            not version.startswith("HTTP/1.")
            or not status_text.isdigit()
            or rest[3:4] not in ("", " ")
        ):
            self._fail(_malformed(self.url, f"bad status line {lines[0][:100]!r}"))
            return
        status = int(status_text)
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if not sep:
                self._fail(_malformed(self.url, f"bad header line {line[:100]!r}"))
                return
            name = name.strip().lower()
            value = value.strip()
            previous = headers.get(name)
            headers[name] = value if previous is None else f"{previous}, {value}"
        body_start = end + 4
        if 100 <= status < 200 and status != 101:
            # An interim response (100 Continue, 103 Early Hints): the real one follows.
            leftover = bytes(head[body_start : self.head_len])
            head[: len(leftover)] = leftover
            self.head_len = len(leftover)
            self._parse_head(0)
            return
        self.status = status
        self.headers = headers
        connection = headers.get("connection", "").lower()
        if version == "HTTP/1.1":
            self.keep_alive = "close" not in connection
        else:
            self.keep_alive = "keep-alive" in connection
        extra = self.head_view[body_start : self.head_len]

        transfer_encoding = headers.get("transfer-encoding")
        content_length = headers.get("content-length")
        if status in (204, 304):
            self.body = bytearray()
            self.keep_alive = self.keep_alive and not extra
            self._complete()
        elif transfer_encoding is not None and transfer_encoding.lower() != "identity":
            if not transfer_encoding.lower().endswith("chunked"):
                self._fail(
                    _malformed(self.url, f"unsupported Transfer-Encoding {transfer_encoding!r}")
                )
                return
            self.state = _CHUNKED
            self.body = bytearray()
            self.raw = bytearray(extra)
            self.chunk_state = _CHUNK_SIZE
            self.chunk_left = 0
            self._parse_chunks()
        elif content_length is not None:
            self._start_length_body(content_length, extra)
        else:
            self.state = _UNTIL_CLOSE
            self.keep_alive = False
            self.body = bytearray(extra)
            self._check_growing_body()

    def _start_length_body(self, content_length: str, extra: memoryview) -> None:
        # Repeated identical Content-Length headers arrive joined as "n, n".
        values = {v.strip() for v in content_length.split(",")}
        text = values.pop() if len(values) == 1 else ""
        if not text.isdigit():
            self._fail(_malformed(self.url, f"bad Content-Length {content_length[:100]!r}"))
            return
        length = int(text)
        if self.max_bytes is not None and length > self.max_bytes:
            self._fail(
                ObjectTooLarge(
                    f"Content-Length {length} > max_bytes {self.max_bytes}",
                    url=self.url,
                    stage="fetch",
                    cause=Reason.OBJECT_TOO_LARGE,
                )
            )
            return
        body = bytearray(length)
        have = min(len(extra), length)
        body[:have] = extra[:have]
        if len(extra) > length:
            # Bytes past the body (a misbehaving server): the next response's framing is
            # unknown, so this connection is not reused.
            self.keep_alive = False
        self.body = body
        if have == length:
            self._complete()
            return
        self.body_view = memoryview(body)
        self.got = have
        self.expected = length
        self.state = _LENGTH

    def _parse_chunks(self) -> None:
        raw = self.raw
        pos = 0
        size = len(raw)
        while pos < size:
            if self.chunk_state == _CHUNK_DATA:
                take = min(self.chunk_left, size - pos)
                self.body += raw[pos : pos + take]
                pos += take
                self.chunk_left -= take
                if self.chunk_left:
                    break
                self.chunk_state = _CHUNK_END
                continue
            eol = raw.find(b"\r\n", pos)
            if eol < 0:
                if size - pos > _MAX_CHUNK_LINE:
                    self._fail(_malformed(self.url, "chunk header line too long"))
                    return
                break
            line = raw[pos:eol]
            pos = eol + 2
            if self.chunk_state == _CHUNK_SIZE:
                size_text = line.split(b";", 1)[0].strip()
                try:
                    chunk_size = int(size_text, 16)
                except ValueError:
                    chunk_size = -1
                if chunk_size < 0:
                    self._fail(_malformed(self.url, f"bad chunk size {bytes(line[:40])!r}"))
                    return
                if chunk_size == 0:
                    self.chunk_state = _CHUNK_TRAILER
                else:
                    self.chunk_left = chunk_size
                    self.chunk_state = _CHUNK_DATA
                    if not self._check_growing_body(chunk_size):
                        return
            elif self.chunk_state == _CHUNK_END:
                if line:
                    self._fail(_malformed(self.url, "chunk not followed by CRLF"))
                    return
                self.chunk_state = _CHUNK_SIZE
            elif not line:  # the empty line that ends the trailers
                if pos < size:
                    self.keep_alive = False
                self.raw = bytearray()
                self._complete()
                return
        del raw[:pos]

    def _check_growing_body(self, upcoming: int = 0) -> bool:
        """Fail with ObjectTooLarge once a body of unknown length passes max_bytes."""
        if self.max_bytes is None or len(self.body) + upcoming <= self.max_bytes:
            return True
        self._fail(
            ObjectTooLarge(
                f"body over max_bytes {self.max_bytes}",
                url=self.url,
                stage="fetch",
                cause=Reason.OBJECT_TOO_LARGE,
            )
        )
        return False

    # -- endings ----------------------------------------------------------------------

    def _complete(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        response = Response(self.status, self.headers, self.body, self.first_byte_at - self.sent_at)
        # Drop our references so the caller owns the only one (and may resize it).
        self.body = _NO_BODY
        self.body_view = _NO_VIEW
        waiter = self.waiter
        self.waiter = None
        self.served += 1
        if self.keep_alive and not self.lost:
            self.state = _IDLE
            self.pool._put_idle(self)
        else:
            self._discard()
        if waiter is not None and not waiter.done():
            waiter.set_result(response)

    def _fail(self, error: BaseException) -> None:
        waiter = self.waiter
        self.waiter = None
        self._discard()
        if waiter is not None and not waiter.done():
            waiter.set_exception(error)

    def _discard(self) -> None:
        """Close the connection (never to be reused) and release its pool slot."""
        self.state = _DEAD
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        self.body = _NO_BODY
        self.body_view = _NO_VIEW
        if self.transport is not None and not self.lost:
            self.transport.abort()
        self.pool._release(self)


class ConnectionPool:
    """Keep-alive HTTP/1.1 connections for whole-object GETs, bounded in number.

    ``get`` sends ``GET target`` to ``scheme://host:port`` with ``headers`` (a ``Host``
    header is added when absent) and returns the :class:`Response` read to the end.
    ``url`` labels errors only (e.g. ``s3://bucket/key``): never put credentials in it.
    ``max_bytes`` bounds the body (checked against ``Content-Length`` before reading).
    """

    def __init__(
        self,
        *,
        max_connections: int = 256,
        timeouts: Timeouts = _DEFAULT_TIMEOUTS,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        # Set before validating: __del__ runs even when __init__ raises.
        self._closed = False
        self._connections: set[_Connection] = set()
        if isinstance(max_connections, bool) or not isinstance(max_connections, int):
            raise ConfigError(f"max_connections must be an int, got {max_connections!r}")
        if max_connections < 1:
            raise ConfigError(f"max_connections must be >= 1, got {max_connections}")
        self.max_connections = max_connections
        self.timeouts = timeouts
        self._ssl_context = ssl_context
        self._idle: dict[_Key, list[_Connection]] = {}
        self._idle_count = 0
        self._open_count = 0  # connections open or being opened; each holds one slot
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()
        self._host_headers: dict[tuple[str, str, int], tuple[_Key, str]] = {}
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
        scheme: str,
        host: str,
        port: int,
        target: str,
        headers: Sequence[tuple[str, str]],
        *,
        url: str,
        max_bytes: int | None = None,
    ) -> Response:
        """GET ``target`` and return the whole response (any status)."""
        if self._closed:
            raise RuntimeError("pool is closed")
        origin = self._host_headers.get((scheme, host, port))
        if origin is None:
            origin = self._origin(scheme, host, port)
        key, host_header = origin
        request = _build_request(target, host_header, headers)

        # With callers queued for a slot, a newcomer queues too (FIFO) rather than take the
        # idle connection that was just released for the caller at the head.
        conn = None if self._waiters else self._pop_idle(key)
        if conn is None:
            conn = await self._acquire(key, url)
        while True:
            waiter = conn.start(request, url, max_bytes)
            try:
                return await waiter
            except ConnectionFailed:
                if conn.served == 0 or conn.started or self._closed:
                    raise
                # A kept-alive connection the server closed while it sat idle: the request
                # never reached it, and GET is idempotent, so one attempt on a fresh
                # connection (served == 0, so never retried again) is safe.
                conn = await self._acquire(key, url, allow_idle=False)
            except BaseException:
                if conn.waiter is waiter:
                    conn.abandon()
                raise

    async def close(self) -> None:
        """Close every connection and wait until their sockets are closed. Idempotent."""
        self._closed = True
        for conn in list(self._connections):
            # A connection still being opened has no socket to wait for yet; _connect
            # closes it when create_connection returns.
            if conn.transport is not None:
                self._lost_futures.append(conn.lost_future)
            conn.shutdown(RuntimeError("pool is closed"))
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

    # -- slots and idle connections -----------------------------------------------------

    def _origin(self, scheme: str, host: str, port: int) -> tuple[_Key, str]:
        default_port = _DEFAULT_PORTS.get(scheme)
        if default_port is None:
            raise ConfigError(f"unsupported scheme {scheme!r}: expected 'http' or 'https'")
        if not host:
            raise ConfigError("empty host")
        name = f"[{host}]" if ":" in host and not host.startswith("[") else host
        host_header = name if port == default_port else f"{name}:{port}"
        origin = ((host.strip("[]"), port, scheme == "https"), host_header)
        self._host_headers[(scheme, host, port)] = origin
        return origin

    def _pop_idle(self, key: _Key) -> _Connection | None:
        stack = self._idle.get(key)
        while stack:
            # Most recently used first: the warmest connection, the least likely timed out.
            conn = stack.pop()
            self._idle_count -= 1
            conn.in_idle = False
            transport = conn.transport
            if conn.state == _IDLE and transport is not None and not transport.is_closing():
                return conn
            conn._discard()
        return None

    def _put_idle(self, conn: _Connection) -> None:
        if self._closed:
            conn._discard()
            return
        conn.in_idle = True
        self._idle.setdefault(conn.key, []).append(conn)
        self._idle_count += 1
        self._wake_one()

    def _release(self, conn: _Connection) -> None:
        """Forget ``conn`` (closed or closing) and give its slot to a waiter."""
        if conn.in_idle:
            conn.in_idle = False
            self._idle[conn.key].remove(conn)
            self._idle_count -= 1
        if conn.holds_slot:
            conn.holds_slot = False
            self._open_count -= 1
            self._connections.discard(conn)
            self._wake_one()

    def _evict_idle(self) -> bool:
        """Close the least recently used idle connection of any origin, freeing a slot."""
        for stack in self._idle.values():
            if stack:
                stack[0]._discard()
                return True
        return False

    def _wake_one(self) -> None:
        waiters = self._waiters
        while waiters:
            waiter = waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    async def _acquire(self, key: _Key, url: str, *, allow_idle: bool = True) -> _Connection:
        """A connection to ``key``: an idle one if allowed, else a new one once a slot is
        free. Callers queue in FIFO order; a newcomer does not overtake queued callers."""
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

    async def _connect(self, key: _Key, url: str, loop: asyncio.AbstractEventLoop) -> _Connection:
        host, port, tls = key
        conn = _Connection(self, key, loop, self.timeouts)
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
                loop.create_connection(
                    lambda: conn,
                    host,
                    port,
                    ssl=ssl_context,
                    server_hostname=host if tls else None,
                ),
                self.timeouts.connect,
            )
        except (OSError, *_TIMEOUT_ERRORS) as exc:
            conn._discard()
            raise _connect_error(exc, url, self.timeouts.connect) from exc
        except BaseException:
            conn._discard()
            raise
        if self._closed:
            conn._discard()
            raise RuntimeError("pool is closed")
        return conn


def _connect_error(exc: Exception, url: str, timeout: float) -> FetchTimeout | ConnectionFailed:
    if isinstance(exc, _TIMEOUT_ERRORS):
        return FetchTimeout(
            f"could not connect within {timeout:g} s",
            url=url,
            stage="fetch",
            cause=Reason.CONNECT_TIMEOUT,
        )
    if isinstance(exc, (ssl.SSLError, ssl.CertificateError)):
        cause = Reason.TLS_FAILED
    elif isinstance(exc, ConnectionRefusedError):
        cause = Reason.CONNECTION_REFUSED
    else:
        cause = Reason.CONNECTION_FAILED
    return ConnectionFailed(str(exc) or type(exc).__name__, url=url, stage="fetch", cause=cause)


def _build_request(target: str, host_header: str, headers: Sequence[tuple[str, str]]) -> bytes:
    parts = ["GET ", target, " HTTP/1.1\r\n"]
    has_host = False
    for name, value in headers:
        if len(name) == 4 and name.lower() == "host":
            has_host = True
        parts += (name, ": ", value, "\r\n")
    if not has_host:
        parts += ("Host: ", host_header, "\r\n")
    parts.append("\r\n")
    text = "".join(parts)
    # One CR and one LF per line we wrote; any other would let a header value or the
    # target inject headers. Counting is cheaper than checking each value.
    lines = len(headers) + (1 if has_host else 2) + 1
    if (
        text.count("\n") != lines
        or text.count("\r") != lines
        or " " in target
        or not target.startswith("/")
    ):
        raise ConfigError(f"invalid request target or header value for {target[:100]!r}")
    try:
        return text.encode("ascii")
    except UnicodeEncodeError as exc:
        raise ConfigError("request target and headers must be ASCII (URI-encode the path)") from exc
