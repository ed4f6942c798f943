"""The two sockets of one proxied connection: the client side and its upstream.

* :class:`Client` paces what is sent to the client by the bandwidth caps (see
  :mod:`.bandwidth`), counts it, and ends the connection either cleanly (FIN) or with a
  TCP reset that still delivers what was sent before it.
* :class:`Upstream` is one keep-alive connection to the server, owned by one client
  connection and reopened when the server may have dropped it.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import socket
import struct
import termios
import time
from typing import Any

from .bandwidth import TokenBucket
from .http import CHUNK
from .stats import Stats

__all__ = ["Client", "Upstream", "set_nodelay"]

# The upstream (Go net/http) closes idle keep-alive connections after a while; reconnecting
# before that avoids racing its close.
_UPSTREAM_MAX_IDLE_S = 10.0


def set_nodelay(writer: asyncio.StreamWriter) -> None:
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


class Upstream:
    """One upstream connection, owned by one client connection (so keep-alive on both)."""

    def __init__(self, host: str, port: int, stats: Stats) -> None:
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
                self._host, self._port, limit=CHUNK
            )
            set_nodelay(self.writer)
            self._stats.upstream_connections_total += 1
        self.last_used = loop.time()
        return self.reader, self.writer

    def close(self) -> None:
        if self.writer is not None:
            self.writer.transport.abort()
        self.reader = self.writer = None


class Client:
    """The client side of one connection: paced, counted writes and the two ways to end."""

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        stats: Stats,
        bandwidth_bytes_per_s: float | None,
        total_bandwidth: TokenBucket | None = None,
    ) -> None:
        self.reader, self.writer, self._stats = reader, writer, stats
        self._buckets: list[TokenBucket] = []
        if bandwidth_bytes_per_s is not None:
            self._buckets.append(TokenBucket(bandwidth_bytes_per_s))
        if total_bandwidth is not None:
            self._buckets.append(total_bandwidth)
        # Pace in slices of ~20 ms of transfer so the cap is smooth, not bursty.
        tightest = min((bucket.rate for bucket in self._buckets), default=None)
        self._slice = CHUNK if tightest is None else max(1024, int(tightest / 50))
        self.closed = False

    async def send(self, data: bytes, *, counted: bool = True) -> None:
        """Write paced by the bandwidth caps; ``counted=False`` for the proxy's own replies."""
        if not self._buckets or not counted:
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
            # Every cap is charged (each one's allowance is spent); the slowest sets the wait.
            wait = max([bucket.charge(len(piece), now) for bucket in self._buckets])
            if wait > 0.001:
                await asyncio.sleep(wait)

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
