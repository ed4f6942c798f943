"""The runtime's event loop, which knows its connections (``create_connection``,
``start_tls``) until they are lost, so a closing runtime closes the loop only after the last
one (a loop closed under a TLS shutdown leaks its socket). Connections still closing after
``CONNECTIONS_CLOSE_TIMEOUT_S``, and those nobody closes, are aborted.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable
from typing import Any, TypeVar, cast

log = logging.getLogger(__name__)

ProtocolT = TypeVar("ProtocolT", bound=asyncio.BaseProtocol)


class Connections:
    """The connections of one loop that are made and not lost yet."""

    def __init__(self) -> None:
        self._open: set[_Watch] = set()
        self._all_lost: asyncio.Future[None] | None = None

    def __len__(self) -> int:
        return len(self._open)

    def made(self, watch: _Watch) -> None:
        self._open.add(watch)

    def lost(self, watch: _Watch) -> None:
        self._open.discard(watch)
        if not self._open and self._all_lost is not None and not self._all_lost.done():
            self._all_lost.set_result(None)

    async def close(self, timeout: float) -> None:
        """Abort what nobody closes; wait up to ``timeout`` for the rest, then abort them."""
        for watch in list(self._open):
            if not watch.transport.is_closing():
                watch.transport.abort()
        if await self._wait_all_lost(timeout):
            return
        for watch in list(self._open):
            watch.transport.abort()
        if not await self._wait_all_lost(timeout):
            log.warning("%d connection(s) still open after they were aborted", len(self))

    async def _wait_all_lost(self, timeout: float) -> bool:
        if not self._open:
            return True
        self._all_lost = all_lost = asyncio.get_running_loop().create_future()
        try:
            done, _ = await asyncio.wait([all_lost], timeout=timeout)
        finally:
            self._all_lost = None
        return bool(done)


class _Watch(asyncio.BaseProtocol):
    """Stands in for a connection's protocol, to tell :class:`Connections` when the
    connection is made and lost. The other callbacks are the protocol's own bound methods,
    set on the instance: the transport calls them with no extra call in between."""

    forwarded: tuple[str, ...] = ()
    transport: asyncio.Transport

    def __init__(self, protocol: asyncio.BaseProtocol, connections: Connections) -> None:
        self.protocol = protocol
        self._connections = connections
        self._lost = False
        for name in self.forwarded:
            if hasattr(protocol, name):
                setattr(self, name, getattr(protocol, name))

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.adopt(transport)
        self.protocol.connection_made(transport)

    def adopt(self, transport: asyncio.BaseTransport) -> None:
        """Count the connection as made on ``transport`` (unless it is lost already)."""
        if not self._lost:
            self.transport = cast(asyncio.Transport, transport)
            self._connections.made(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost = True
        self._connections.lost(self)
        self.protocol.connection_lost(exc)


class _WatchedProtocol(_Watch, asyncio.Protocol):
    forwarded = ("data_received", "eof_received", "pause_writing", "resume_writing")


class _WatchedBufferedProtocol(_Watch, asyncio.BufferedProtocol):
    # A subclass of BufferedProtocol and not of Protocol: how both loops tell one.
    forwarded = ("get_buffer", "buffer_updated", "eof_received", "pause_writing", "resume_writing")


def _watch(protocol: asyncio.BaseProtocol, connections: Connections) -> _Watch:
    if isinstance(protocol, asyncio.BufferedProtocol):
        return _WatchedBufferedProtocol(protocol, connections)
    return _WatchedProtocol(protocol, connections)


class WatchingLoop(asyncio.AbstractEventLoop):
    """An event loop that knows its ``connections`` (asyncio's or uvloop's)."""

    def __init__(self) -> None:
        super().__init__()
        self.connections = Connections()

    async def create_connection(
        self, protocol_factory: Callable[[], ProtocolT], *args: Any, **kwargs: Any
    ) -> tuple[asyncio.Transport, ProtocolT]:
        made: list[ProtocolT] = []

        def watched() -> _Watch:
            protocol = protocol_factory()
            made.append(protocol)
            return _watch(protocol, self.connections)

        transport, _ = await super().create_connection(watched, *args, **kwargs)
        return transport, made[-1]

    async def start_tls(
        self,
        transport: asyncio.BaseTransport,
        protocol: asyncio.BaseProtocol,
        *args: Any,
        **kwargs: Any,
    ) -> asyncio.Transport | None:
        under = transport.get_protocol()
        watch = _watch(protocol, self.connections)
        try:
            tls = await super().start_tls(
                cast(asyncio.WriteTransport, transport), watch, *args, **kwargs
            )
        finally:
            # The TLS connection stands for the one under it (closed if start_tls failed).
            if isinstance(under, _Watch):
                self.connections.lost(under)
        if tls is not None:
            watch.adopt(tls)  # start_tls calls no connection_made: the caller connected
        return tls


class AsyncioLoop(WatchingLoop, asyncio.SelectorEventLoop):
    pass


@functools.cache
def loop_class() -> type[WatchingLoop]:
    """uvloop's loop when uvloop is installed, else asyncio's, knowing its connections."""
    try:
        import uvloop
    except ImportError:
        return AsyncioLoop

    # uvloop's annotations differ from asyncio's in places, as in uvloop.Loop itself.
    class _UvLoop(WatchingLoop, uvloop.Loop):  # type: ignore[misc]
        pass

    return _UvLoop
