"""One keep-alive HTTP/1.1 connection, as an :class:`asyncio.BufferedProtocol`.

The response state lives on the protocol, not in a task: the event loop calls
``get_buffer`` and ``buffer_updated`` directly and the request's future is resolved from
those callbacks, so a GET costs one future and no extra task switches. For a
``Content-Length`` body, ``get_buffer`` hands the loop the unfilled tail of the one
``bytearray`` that becomes :attr:`Response.body`, so the kernel copies the body straight
into place. Framing is decided by :mod:`.parser`; this module owns the buffers, the timer
and the socket.

A connection holds one slot of its :class:`ConnectionOwner` (the pool) from creation until
it is closed; it hands itself back through ``connection_idle`` only after a response was
read to the end on a connection the server keeps open, and every other ending closes it and
calls ``connection_released`` exactly once.
"""

from __future__ import annotations

import asyncio
from typing import Protocol, cast

from concurrent_loader.config import Timeouts
from concurrent_loader.errors import Reason

from .errors import closed_early, framing_error, incomplete, timed_out, too_large
from .parser import (
    CHUNKED,
    INTERIM,
    ChunkedDecoder,
    FramingError,
    check_partial,
    check_partial_length,
    parse_head,
)
from .response import Response
from .sockets import has_unread_bytes, socket_fd

__all__ = ["Connection", "ConnectionOwner", "Key"]

#: what a connection can be reused for: ``(host, port, tls)``
Key = tuple[str, int, bool]

# Big enough for any S3 response head plus the first slice of the body; the rest of a
# Content-Length body goes straight into its final buffer.
_HEAD_BUFFER_BYTES = 16 * 1024
_SCRATCH_BYTES = 64 * 1024

# Connection states.
_IDLE = 0  # no request in flight (pooled, or being handed out)
_HEAD = 1  # waiting for / reading the status line and headers
_LENGTH = 2  # reading a Content-Length body into its final buffer
_CHUNKED = 3  # reading a Transfer-Encoding: chunked body
_UNTIL_CLOSE = 4  # reading a body delimited by the end of the connection
_DEAD = 5  # closed or failed; never reused

_NO_BODY = bytearray()
_NO_VIEW = memoryview(_NO_BODY)


class ConnectionOwner(Protocol):
    """What a connection tells its pool."""

    def connection_idle(self, conn: Connection) -> None:
        """``conn`` finished a response and may serve another."""

    def connection_released(self, conn: Connection) -> None:
        """``conn`` is closed or closing: forget it and free its slot (called once)."""


class Connection(asyncio.BufferedProtocol):
    """One keep-alive connection to ``key`` and the parser of the response in flight."""

    __slots__ = (
        "body",
        "body_view",
        "byte_range",
        "decoder",
        "expected",
        "fd",
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
        "owner",
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
        self, owner: ConnectionOwner, key: Key, loop: asyncio.AbstractEventLoop, timeouts: Timeouts
    ) -> None:
        self.owner = owner
        self.key = key
        self.loop = loop
        self.timeouts = timeouts
        self.transport: asyncio.Transport | None = None
        self.fd = -1
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
        self.byte_range: tuple[int, int] | None = None
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
        self.decoder = ChunkedDecoder()

    # -- asyncio protocol callbacks -----------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        self.fd = socket_fd(transport)

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
            self._read_head(search_from)
            return
        if state == _CHUNKED:
            self._feed_chunks(self.scratch[:nbytes])
        elif state == _UNTIL_CLOSE:
            self.body += self.scratch[:nbytes]
            self._check_body_limit()
        else:
            # Bytes nobody asked for (a response without a request): the framing is lost.
            self.discard()

    def eof_received(self) -> bool:
        # Returning False lets the transport close; connection_lost decides what the EOF
        # means for the response in flight.
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        if not self.lost_future.done():
            self.lost_future.set_result(None)
        state = self.state
        if state in (_IDLE, _DEAD):
            self.state = _DEAD
            self.owner.connection_released(self)
            return
        if state == _UNTIL_CLOSE and exc is None:
            self._finish_unknown_length()
            return
        url = self.url
        if exc is None and state == _LENGTH:
            self.fail(incomplete(url, f"got {self.got} of {self.expected} bytes"))
        elif exc is None and state == _CHUNKED:
            got = len(self.decoder.body)
            self.fail(
                incomplete(url, f"chunked body ended after {got} bytes, before its last chunk")
            )
        elif not self.started:
            self.fail(closed_early(url, exc, "before any response byte"))
        elif state == _HEAD:
            self.fail(closed_early(url, exc, "inside the response headers"))
        else:
            if state == _LENGTH:
                progress = f"{self.got} of {self.expected}"
            else:
                progress = str(len(self.decoder.body if state == _CHUNKED else self.body))
            self.fail(closed_early(url, exc, f"after {progress} body bytes"))

    # -- requests ---------------------------------------------------------------------

    def start(
        self,
        request: bytes,
        url: str,
        max_bytes: int | None,
        byte_range: tuple[int, int] | None,
    ) -> asyncio.Future[Response]:
        """Send ``request`` and return the future of its response."""
        loop = self.loop
        waiter: asyncio.Future[Response] = loop.create_future()
        self.waiter = waiter
        self.url = url
        self.max_bytes = max_bytes
        self.byte_range = byte_range
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
        error = closed_early(self.url, None, "before the request was sent")
        error.__cause__ = exc
        self.fail(error)

    def reusable(self) -> bool:
        """Whether this idle connection can take another request: the server may have
        closed it while it sat in the pool, or sent bytes no request asked for that the
        loop has not read yet (past the end of the last response, or later), which the
        next request would read as its response."""
        transport = self.transport
        return (
            self.state == _IDLE
            and transport is not None
            and not transport.is_closing()
            and not has_unread_bytes(self.fd)
        )

    def abandon(self) -> None:
        """Give up the request in flight (its caller was cancelled): close, free the slot."""
        self.waiter = None
        self.discard()

    def _on_timer(self) -> None:
        if self.waiter is None or self.state in (_IDLE, _DEAD):
            return
        timeouts = self.timeouts
        now = self.loop.time()
        if not self.started:
            remaining = self.sent_at + timeouts.first_byte - now
            if remaining <= 0:
                message = f"no response byte within {timeouts.first_byte:g} s"
                self.fail(timed_out(self.url, message, Reason.FIRST_BYTE_TIMEOUT))
                return
        else:
            remaining = self.last_data + timeouts.read - now
            if remaining <= 0:
                message = f"no data for {timeouts.read:g} s"
                self.fail(timed_out(self.url, message, Reason.READ_TIMEOUT))
                return
        self.timer = self.loop.call_at(now + remaining, self._on_timer)

    # -- framing ----------------------------------------------------------------------

    def _read_head(self, search_from: int) -> None:
        try:
            head = parse_head(self.head, search_from, self.head_len)
            while head is not None and head[3] == INTERIM:
                # An interim response (100 Continue, 103 Early Hints): the real one follows.
                leftover = bytes(self.head[head[4] : self.head_len])
                self.head[: len(leftover)] = leftover
                self.head_len = len(leftover)
                head = parse_head(self.head, 0, self.head_len)
            if head is None:
                return
            status, headers, keep_alive, framing, body_start = head
            if self.byte_range is not None and 200 <= status < 300:
                check_partial(status, headers, framing, self.byte_range)
        except FramingError as exc:
            self.fail(framing_error(self.url, exc))
            return
        self.status = status
        self.headers = headers
        self.keep_alive = keep_alive
        extra = self.head_view[body_start : self.head_len]
        if framing >= 0:
            self._start_length_body(framing, extra)
        elif framing == CHUNKED:
            self.state = _CHUNKED
            self.decoder = ChunkedDecoder(self.max_bytes)
            self._feed_chunks(extra)
        else:
            self.state = _UNTIL_CLOSE
            self.body = bytearray(extra)
            self._check_body_limit()

    def _start_length_body(self, length: int, extra: memoryview) -> None:
        if self.max_bytes is not None and length > self.max_bytes:
            detail = f"Content-Length {length} > max_bytes {self.max_bytes}"
            self.fail(too_large(self.url, detail))
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

    def _feed_chunks(self, data: memoryview) -> None:
        decoder = self.decoder
        try:
            done = decoder.feed(data)
        except FramingError as exc:
            self.fail(framing_error(self.url, exc))
            return
        if done:
            if decoder.overrun:
                self.keep_alive = False
            self.body = decoder.body
            self.decoder = ChunkedDecoder()  # the caller owns the body now
            self._finish_unknown_length()

    def _check_body_limit(self) -> None:
        """Fail with ObjectTooLarge once an until-close body passes max_bytes."""
        if self.max_bytes is not None and len(self.body) > self.max_bytes:
            self.fail(too_large(self.url, f"body over max_bytes {self.max_bytes}"))

    def _finish_unknown_length(self) -> None:
        """Complete a chunked or until-close body, once its length is checked against the
        range asked for (a Content-Length body was checked with its head)."""
        if self.byte_range is not None and 200 <= self.status < 300:
            try:
                check_partial_length(len(self.body), self.byte_range)
            except FramingError as exc:
                self.fail(framing_error(self.url, exc))
                return
        self._complete()

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
        # A response that came before its request was all written (the rest still in the
        # write buffer) leaves the server to read that rest as another request.
        transport = self.transport
        if (
            self.keep_alive
            and not self.lost
            and transport is not None
            and not transport.get_write_buffer_size()
        ):
            self.state = _IDLE
            self.owner.connection_idle(self)
        else:
            self.discard()
        if waiter is not None and not waiter.done():
            waiter.set_result(response)

    def fail(self, error: BaseException) -> None:
        """Close now, failing the request in flight (if any) with ``error``."""
        waiter = self.waiter
        self.waiter = None
        self.discard()
        if waiter is not None and not waiter.done():
            waiter.set_exception(error)

    def discard(self) -> None:
        """Close the connection (never to be reused) and release its pool slot."""
        self.state = _DEAD
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        self.body = _NO_BODY
        self.body_view = _NO_VIEW
        if self.transport is not None and not self.lost:
            self.transport.abort()
        self.owner.connection_released(self)
