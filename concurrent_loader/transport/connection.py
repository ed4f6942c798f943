"""One keep-alive HTTP/1.1 connection, as an :class:`asyncio.BufferedProtocol`: one future
per GET, no task; framing is :class:`.reader.ResponseReader`'s. A connection holds one slot
of its :class:`ConnectionOwner` until closed; it goes back through ``connection_idle`` only
after a response read to the end on a connection kept open, every other ending calls
``connection_released`` exactly once, and :meth:`Connection.reusable` checks the socket for
unasked-for bytes before reuse.
"""

from __future__ import annotations

import asyncio
from typing import Protocol, cast

from concurrent_loader.config import Timeouts
from concurrent_loader.errors import Reason

from .errors import closed_early, incomplete, timed_out
from .reader import (
    CHUNKED_BODY,
    DEAD,
    HEAD,
    IDLE,
    LENGTH,
    NO_BODY,
    NO_VIEW,
    UNTIL_CLOSE,
    DigestFor,
    Response,
    ResponseReader,
)
from .sockets import SocketProbe, socket_fd

__all__ = ["Connection", "ConnectionOwner", "Key"]

#: what a connection can be reused for: ``(host, port, tls)``
Key = tuple[str, int, bool]


class ConnectionOwner(Protocol):
    """What a connection tells its pool."""

    def connection_idle(self, conn: Connection) -> None:
        """``conn`` finished a response and may serve another."""

    def connection_released(self, conn: Connection) -> None:
        """``conn`` is closed or closing: forget it and free its slot (called once)."""


class Connection(ResponseReader):
    """One keep-alive connection to ``key`` and the response in flight on it."""

    __slots__ = (
        "holds_slot",
        "in_idle",
        "key",
        "lost",
        "lost_future",
        "owner",
        "probe",
        "sent_at",
        "served",
        "timeouts",
        "timer",
        "transport",
        "waiter",
    )

    def __init__(
        self, owner: ConnectionOwner, key: Key, loop: asyncio.AbstractEventLoop, timeouts: Timeouts
    ) -> None:
        super().__init__(loop)
        self.owner = owner
        self.key = key
        self.timeouts = timeouts
        self.transport: asyncio.Transport | None = None
        self.probe = SocketProbe(-1)  # the socket's, once connected
        self.lost = False
        self.lost_future: asyncio.Future[None] = loop.create_future()
        self.holds_slot = True  # every connection owns one of the pool's slots until released
        self.in_idle = False
        self.served = 0  # responses completed on this connection
        self.waiter: asyncio.Future[Response] | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.sent_at = 0.0

    # -- asyncio protocol callbacks -----------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        self.probe = SocketProbe(socket_fd(transport))

    def eof_received(self) -> bool:
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        if not self.lost_future.done():
            self.lost_future.set_result(None)
        state = self.state
        if state in (IDLE, DEAD):
            self.state = DEAD
            self.owner.connection_released(self)
            return
        if state == UNTIL_CLOSE and exc is None:
            self._finish_unknown_length()
            return
        url = self.url
        if exc is None and state == LENGTH:
            self.fail(incomplete(url, f"got {self.got} of {self.expected} bytes"))
        elif exc is None and state == CHUNKED_BODY:
            got = len(self.decoder.body)
            self.fail(
                incomplete(url, f"chunked body ended after {got} bytes, before its last chunk")
            )
        elif not self.started:
            self.fail(closed_early(url, exc, "before any response byte"))
        elif state == HEAD:
            self.fail(closed_early(url, exc, "inside the response headers"))
        else:
            if state == LENGTH:
                progress = f"{self.got} of {self.expected}"
            else:
                progress = str(len(self.decoder.body if state == CHUNKED_BODY else self.body))
            self.fail(closed_early(url, exc, f"after {progress} body bytes"))

    # -- requests ---------------------------------------------------------------------

    def start(
        self,
        request: bytes,
        url: str,
        max_bytes: int | None,
        byte_range: tuple[int, int] | None,
        digest_for: DigestFor | None = None,
    ) -> asyncio.Future[Response]:
        """Send ``request`` and return the future of its response."""
        loop = self.loop
        waiter: asyncio.Future[Response] = loop.create_future()
        self.waiter = waiter
        self.url = url
        self.max_bytes = max_bytes
        self.byte_range = byte_range
        self.digest_for = digest_for
        self.digest = None
        self.state = HEAD
        self.started = False
        self.head_len = 0
        transport = self.transport
        if self.lost or transport is None or transport.is_closing():
            # Closed by the server: fail it as such (the pool retries a reused one).
            self._fail_unsent(None)
            return waiter
        now = loop.time()
        self.sent_at = now
        if self.timer is None:
            # One timer per connection, not per request: it outlives a response (_on_timer).
            timeouts = self.timeouts
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
        """Whether this idle connection can take another request: not closed, and no
        unasked-for byte waiting, which the next request would read as its response."""
        transport = self.transport
        return (
            self.state == IDLE
            and transport is not None
            and not transport.is_closing()
            and not self.probe.pending()
        )

    def abandon(self) -> None:
        """Give up the request in flight (its caller was cancelled): close, free the slot."""
        self.waiter = None
        self.discard()

    def _on_timer(self) -> None:
        self.timer = None
        if self.waiter is None or self.state in (IDLE, DEAD):
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

    # -- endings ----------------------------------------------------------------------

    def _complete(self) -> None:
        response = Response(
            self.status, self.headers, self.body, self.first_byte_at - self.sent_at, self.digest
        )
        self.body = NO_BODY
        self.body_view = NO_VIEW
        self.digest = None
        waiter = self.waiter
        self.waiter = None
        self.served += 1
        if self.keep_alive and not self.lost:
            self.state = IDLE
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
        self.state = DEAD
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        self.body = NO_BODY
        self.body_view = NO_VIEW
        self.digest = None
        if self.transport is not None and not self.lost:
            self.transport.abort()
        self.owner.connection_released(self)
