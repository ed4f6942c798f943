"""The runtime's event loop knows its connections, and a closing runtime waits for those
still closing, boundedly, then aborts them: on asyncio's loop and on uvloop's, against local
servers (TCP, and TLS for ``start_tls``)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import pytest

from concurrent_loader import runtime
from concurrent_loader.loops import AsyncioLoop, WatchingLoop, loop_class
from concurrent_loader.testing import make_private_ca

try:
    import uvloop  # noqa: F401

    HAVE_UVLOOP = True
except ImportError:  # pragma: no cover - uvloop is an optional extra
    HAVE_UVLOOP = False

# More than the kernel buffers of a loopback connection hold: a close waits for it to be sent.
UNSENT = b"x" * (64 << 20)


@pytest.fixture(
    params=[
        "asyncio",
        pytest.param("uvloop", marks=pytest.mark.skipif(not HAVE_UVLOOP, reason="no uvloop")),
    ]
)
def loop(request) -> Iterator[WatchingLoop]:
    loop = AsyncioLoop() if request.param == "asyncio" else loop_class()()
    assert isinstance(loop, WatchingLoop)
    try:
        yield loop
    finally:
        loop.close()


class _Server:
    """A TCP server on loopback, on its own thread, that accepts connections and reads
    nothing until ``read()``; then it reads each to its end and closes it."""

    def __init__(self) -> None:
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._read = threading.Event()
        self._accepted: list[socket.socket] = []
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        try:
            conn, _ = self._listener.accept()
        except OSError:  # stopped first: the test's connection ended before it was accepted
            return
        with conn:
            self._read.wait()
            while conn.recv(1 << 20):
                pass

    def read(self) -> None:
        self._read.set()

    def stop(self) -> None:
        self._read.set()
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes an accept() still waiting
        self._listener.close()
        self._thread.join(10)


@pytest.fixture
def server() -> Iterator[_Server]:
    server = _Server()
    try:
        yield server
    finally:
        server.stop()


class _Recording(asyncio.Protocol):
    def __init__(self) -> None:
        self.lost = False
        self.received = b""
        self.got = 0

    def data_received(self, data: bytes) -> None:
        self.received += data

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True


class _RecordingBuffered(asyncio.BufferedProtocol):
    def __init__(self) -> None:
        self.lost = False
        self.buffer = bytearray(16)
        self.got = 0
        self.received = b""

    def get_buffer(self, sizehint: int) -> memoryview:
        return memoryview(self.buffer)[self.got :]

    def buffer_updated(self, nbytes: int) -> None:
        self.got += nbytes

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True


async def _timed(closing: Awaitable[None]) -> float:
    start = time.monotonic()
    await closing
    return time.monotonic() - start


async def _until(condition: Callable[[], bool]) -> None:
    while not condition():
        await asyncio.sleep(0.01)


@pytest.mark.parametrize("protocol_class", [_Recording, _RecordingBuffered])
def test_the_callers_protocol_is_returned_and_receives(loop: WatchingLoop, protocol_class):
    async def main() -> None:
        async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            writer.write(await reader.readexactly(5))
            await writer.drain()
            writer.close()

        echo_server = await asyncio.start_server(echo, "127.0.0.1", 0)
        port = echo_server.sockets[0].getsockname()[1]
        made = protocol_class()
        transport, protocol = await loop.create_connection(lambda: made, "127.0.0.1", port)
        assert protocol is made
        assert len(loop.connections) == 1
        transport.write(b"hello")
        await _until(lambda: made.received == b"hello" or made.got == 5)
        await loop.connections.close(5.0)  # not closed by its owner: aborted, or read to EOF
        assert made.lost and len(loop.connections) == 0
        echo_server.close()
        await echo_server.wait_closed()

    loop.run_until_complete(main())


def test_a_connection_nobody_closes_is_aborted_at_once(loop: WatchingLoop, server: _Server):
    async def main() -> None:
        made = _Recording()
        await loop.create_connection(lambda: made, "127.0.0.1", server.port)
        took = await _timed(loop.connections.close(10.0))
        assert made.lost and took < 5.0

    loop.run_until_complete(main())


def test_a_closing_connection_is_waited_for(loop: WatchingLoop, server: _Server):
    async def main() -> None:
        made = _Recording()
        transport, _ = await loop.create_connection(lambda: made, "127.0.0.1", server.port)
        transport.write(UNSENT)
        transport.close()  # closing: its bytes wait for the server to read them
        loop.call_later(0.3, server.read)
        took = await _timed(loop.connections.close(10.0))
        assert made.lost and 0.25 < took < 5.0

    loop.run_until_complete(main())


def test_a_connection_still_closing_after_the_wait_is_aborted(loop: WatchingLoop, server: _Server):
    async def main() -> None:
        made = _Recording()
        transport, _ = await loop.create_connection(lambda: made, "127.0.0.1", server.port)
        transport.write(UNSENT)
        transport.close()  # the server never reads
        took = await _timed(loop.connections.close(0.3))
        assert made.lost and 0.25 < took < 5.0

    loop.run_until_complete(main())


def test_start_tls_hands_the_connection_over(loop: WatchingLoop, tmp_path: Path):
    certificate = make_private_ca(tmp_path)
    client_context = ssl.create_default_context(cafile=str(certificate.ca_bundle))

    async def main() -> None:
        async def hello(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            writer.write(b"hello")
            await writer.drain()
            await reader.read()  # until the client closes
            writer.close()

        tls_server = await asyncio.start_server(
            hello, "127.0.0.1", 0, ssl=certificate.server_context()
        )
        port = tls_server.sockets[0].getsockname()[1]
        plain, _ = await loop.create_connection(_Recording, "127.0.0.1", port)
        made = _Recording()
        tls = await loop.start_tls(plain, made, client_context, server_hostname="127.0.0.1")
        assert tls is not None
        # One connection: the TLS one, which stands for the one under it.
        assert len(loop.connections) == 1
        await _until(lambda: made.received == b"hello")
        tls.close()
        took = await _timed(loop.connections.close(10.0))
        assert made.lost and took < 5.0 and len(loop.connections) == 0
        tls_server.close()
        await tls_server.wait_closed()

    loop.run_until_complete(main())


def test_a_closing_runtime_aborts_the_connections_left_open(server: _Server):
    lease = runtime.acquire_runtime()
    made = _Recording()

    async def connect() -> None:
        await asyncio.get_running_loop().create_connection(lambda: made, "127.0.0.1", server.port)

    lease.run(connect())
    lease.release()  # the last lease: no ResourceWarning for the socket, which is closed
    assert lease.closed and made.lost
