"""ConnectionPool against real local HTTP/1.1 servers, on asyncio and on uvloop.

The server below is written for these tests: it speaks just enough HTTP/1.1 to produce
every framing (Content-Length, chunked, until-close) and every failure the pool must turn
into a typed error, and it counts connections and concurrent requests on its side.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import shutil
import socket
import ssl
import struct
import subprocess
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from concurrent_loader.errors import (
    ConfigError,
    ConnectionFailed,
    FetchTimeout,
    IncompleteBody,
    ObjectTooLarge,
)
from concurrent_loader.fetch.http1 import ConnectionPool, Response, Timeouts

try:
    import uvloop

    HAVE_UVLOOP = True
except ImportError:  # pragma: no cover - uvloop is an optional extra
    HAVE_UVLOOP = False

LOOPS = [
    "asyncio",
    pytest.param("uvloop", marks=pytest.mark.skipif(not HAVE_UVLOOP, reason="no uvloop")),
]

Runner = Callable[[Callable[[], Awaitable[Any]]], Any]


@pytest.fixture(params=LOOPS)
def run(request: pytest.FixtureRequest) -> Runner:
    """Run an async test body on a fresh event loop of the parametrized kind, and check
    that it left no socket open."""

    def runner(main: Callable[[], Awaitable[Any]]) -> Any:
        loop = uvloop.new_event_loop() if request.param == "uvloop" else asyncio.new_event_loop()
        before = open_sockets()
        try:
            result = loop.run_until_complete(main())
            loop.run_until_complete(asyncio.sleep(0))
            assert open_sockets() <= before, "the test left sockets open"
            return result
        finally:
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()

    return runner


def payload(n: int) -> bytes:
    return random.Random(n).randbytes(n)


def open_sockets() -> set[str]:
    """Sockets open in this process (the event loop's own pipes and files do not count).

    Compared as sets, not counts: a socket an earlier test left to the garbage collector may
    close while this one runs, and must not hide one this test leaks."""
    found = set()
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # the listing's own fd is gone already
            target = os.readlink(f"/proc/self/fd/{fd}")
            if target.startswith("socket:"):
                found.add(target)
    return found


class Server:
    """A scriptable HTTP/1.1 server. The request path picks the behaviour:

    ``/len/N``           N bytes with Content-Length, keep-alive
    ``/chunked/N``       N bytes chunked (uneven chunk sizes, an extension, a trailer)
    ``/until-close/N``   N bytes, no length, then close
    ``/conn-close/N``    N bytes with Content-Length and ``Connection: close``
    ``/status/S``        status S with a small XML body (204 and 304 without one)
    ``/continue/N``      ``100 Continue``, then ``/len/N``
    ``/slow/N``          ``/len/N`` after 20 ms (counts concurrent requests)
    ``/first-byte/S``    ``/len/10`` after S seconds
    ``/stall/N``         headers and half the body, then silence
    ``/trickle/N``       Content-Length N, sent in 8 pieces 80 ms apart
    ``/truncate/N``      Content-Length N, half the body, then a clean close
    ``/reset/N``         Content-Length N, half the body, then a TCP reset
    ``/fail-reused/N``   ``/len/N`` on a connection's first request; close without a
                         response on any later one
    ``/silent-close``    close without a response
    ``/half-head``       part of the status line on a reused connection, then close
    ``/idle-close/N``    ``/len/N``, then close the connection 20 ms later
    ``/garbage``         a response that is not HTTP
    """

    def __init__(self, ssl_context: ssl.SSLContext | None = None) -> None:
        self.ssl_context = ssl_context
        self.connections = 0
        self.inflight = 0
        self.max_inflight = 0
        self.requests: list[tuple[str, dict[str, str]]] = []
        self.writers: set[asyncio.StreamWriter] = set()
        self.closed_connections = 0
        self.port = 0
        self.handlers: set[asyncio.Task[Any]] = set()

    async def __aenter__(self) -> Server:
        self.server = await asyncio.start_server(self.handle, "127.0.0.1", 0, ssl=self.ssl_context)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self.server.close()
        for task in self.handlers:
            task.cancel()
        await asyncio.gather(*self.handlers, return_exceptions=True)
        await self.server.wait_closed()

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self.writers.add(writer)
        task = asyncio.current_task()
        assert task is not None
        self.handlers.add(task)
        served = 0
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                lines = head.decode("latin-1").split("\r\n")
                _, path, _ = lines[0].split(" ")
                headers = {}
                for line in lines[1:]:
                    if line:
                        name, _, value = line.partition(":")
                        headers[name.strip().lower()] = value.strip()
                self.requests.append((path, headers))
                keep_open = await self.respond(path, writer, served)
                served += 1
                if not keep_open:
                    return
        except (ConnectionError, ssl.SSLError):
            return
        finally:
            self.closed_connections += 1
            self.writers.discard(writer)
            self.handlers.discard(task)
            writer.transport.abort()

    async def respond(self, path: str, writer: asyncio.StreamWriter, served: int) -> bool:
        route, _, arg = path[1:].partition("/")
        if route == "len":
            return await self.send_length(writer, int(arg))
        if route == "chunked":
            body = payload(int(arg))
            out = [b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"]
            step, pos = 1, 0
            while pos < len(body):
                chunk = body[pos : pos + step]
                out.append(b"%x;ext=1\r\n%s\r\n" % (len(chunk), chunk))
                pos += len(chunk)
                step = step * 3 + 7
            out.append(b"0\r\nX-Trailer: yes\r\n\r\n")
            data = b"".join(out)
            # Dribble the framing across many writes so the parser sees every split.
            for i in range(0, len(data), 4093):
                writer.write(data[i : i + 4093])
                await writer.drain()
            return True
        if route == "until-close":
            writer.write(b"HTTP/1.1 200 OK\r\n\r\n" + payload(int(arg)))
            await writer.drain()
            return False
        if route == "conn-close":
            body = payload(int(arg))
            writer.write(
                b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s"
                % (len(body), body)
            )
            await writer.drain()
            return False
        if route == "status":
            status = int(arg)
            if status in (204, 304):
                writer.write(b"HTTP/1.1 %d X\r\n\r\n" % status)
            else:
                body = b"<Error><Code>NoSuchKey</Code></Error>"
                writer.write(
                    b"HTTP/1.1 %d Nope\r\nContent-Length: %d\r\nX-Dup: a\r\nx-dup: b\r\n\r\n%s"
                    % (status, len(body), body)
                )
            return True
        if route == "continue":
            writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            await writer.drain()
            return await self.send_length(writer, int(arg))
        if route == "slow":
            self.inflight += 1
            self.max_inflight = max(self.max_inflight, self.inflight)
            try:
                await asyncio.sleep(0.02)
            finally:
                self.inflight -= 1
            return await self.send_length(writer, int(arg))
        if route == "first-byte":
            await asyncio.sleep(float(arg))
            return await self.send_length(writer, 10)
        if route == "trickle":
            n = int(arg)
            data = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % n + payload(n)
            step = len(data) // 8 + 1
            for i in range(0, len(data), step):
                writer.write(data[i : i + step])
                await writer.drain()
                await asyncio.sleep(0.08)
            return True
        if route in ("stall", "truncate", "reset"):
            n = int(arg)
            writer.write(
                b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % n + payload(n)[: n // 2]
            )
            await writer.drain()
            if route == "stall":
                await asyncio.sleep(30)
            elif route == "reset":
                sock = writer.get_extra_info("socket")
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            return False
        if route == "fail-reused":
            if served:
                return False
            return await self.send_length(writer, int(arg))
        if route == "silent-close":
            return False
        if route == "half-head":
            writer.write(b"HTTP/1.1 2")
            await writer.drain()
            return False
        if route == "idle-close":
            await self.send_length(writer, int(arg))
            await asyncio.sleep(0.02)
            return False
        if route == "garbage":
            writer.write(b"SSH-2.0-OpenSSH\r\n\r\n")
            return False
        raise AssertionError(f"unknown route {path}")

    async def send_length(self, writer: asyncio.StreamWriter, n: int) -> bool:
        body = payload(n)
        writer.write(b'HTTP/1.1 200 OK\r\nContent-Length: %d\r\nETag: "x"\r\n\r\n' % n + body)
        await writer.drain()
        return True


async def get(pool: ConnectionPool, server: Server, path: str, **kwargs: Any) -> Response:
    scheme = "https" if server.ssl_context else "http"
    return await pool.get(
        scheme, "127.0.0.1", server.port, path, [], url=f"test://{path}", **kwargs
    )


def test_content_length_bodies_reuse_one_connection(run: Runner) -> None:
    sizes = [0, 1, 100, 16 * 1024 - 60, 16 * 1024, 110_000, 1_000_003]

    async def main() -> None:
        async with Server() as server, ConnectionPool() as pool:
            for n in sizes * 2:
                response = await get(pool, server, f"/len/{n}")
                assert response.status == 200
                assert response.body == payload(n)
                assert isinstance(response.body, bytearray)
                assert response.headers["content-length"] == str(n)
                assert response.headers["etag"] == '"x"'
                response.body.extend(b"owned")  # the caller owns (and may resize) the body
            assert server.connections == 1
            assert server.requests[0][1]["host"] == f"127.0.0.1:{server.port}"

    run(main)


def test_chunked_bodies(run: Runner) -> None:
    async def main() -> None:
        async with Server() as server, ConnectionPool() as pool:
            for n in [0, 1, 5000, 110_000, 300_001]:
                response = await get(pool, server, f"/chunked/{n}")
                assert response.status == 200
                assert response.body == payload(n)
            assert server.connections == 1

    run(main)


def test_read_until_close(run: Runner) -> None:
    async def main() -> None:
        async with Server() as server, ConnectionPool() as pool:
            for n in [0, 7, 200_000]:
                response = await get(pool, server, f"/until-close/{n}")
                assert response.body == payload(n)
            assert server.connections == 3

    run(main)


def test_statuses_are_returned_not_raised(run: Runner) -> None:
    async def main() -> None:
        async with Server() as server, ConnectionPool() as pool:
            response = await get(pool, server, "/status/404")
            assert response.status == 404
            assert response.body == b"<Error><Code>NoSuchKey</Code></Error>"
            assert response.headers["x-dup"] == "a, b"
            for status in (204, 304):
                response = await get(pool, server, f"/status/{status}")
                assert (response.status, response.body) == (status, b"")
            response = await get(pool, server, "/status/503")
            assert response.status == 503
            response = await get(pool, server, "/continue/1234")
            assert (response.status, response.body) == (200, payload(1234))
            assert server.connections == 1

    run(main)


def test_connection_close_is_not_reused(run: Runner) -> None:
    async def main() -> None:
        async with Server() as server, ConnectionPool() as pool:
            for _ in range(3):
                assert (await get(pool, server, "/conn-close/500")).body == payload(500)
            assert server.connections == 3

    run(main)


def test_concurrency_is_bounded(run: Runner) -> None:
    async def main() -> None:
        async with Server() as server, ConnectionPool(max_connections=16) as pool:
            responses = await asyncio.gather(
                *(get(pool, server, f"/slow/{1000 + i}") for i in range(200))
            )
            assert [r.body for r in responses] == [payload(1000 + i) for i in range(200)]
            assert server.max_inflight == 16
            assert server.connections == 16

    run(main)


def test_waiters_are_served_in_order(run: Runner) -> None:
    async def main() -> None:
        async with Server() as server, ConnectionPool(max_connections=2) as pool:
            tasks = []
            for i in range(12):
                tasks.append(asyncio.ensure_future(get(pool, server, f"/slow/{i}")))
                await asyncio.sleep(0.001)  # queue them in a known order
            await asyncio.gather(*tasks)
            sent = [int(path.rsplit("/", 1)[1]) for path, _ in server.requests]
            assert sent == list(range(12))
            assert server.connections == 2

    run(main)


def test_stale_reused_connection_is_retried_once(run: Runner) -> None:
    async def main() -> None:
        async with Server() as server, ConnectionPool() as pool:
            assert (await get(pool, server, "/fail-reused/10")).body == payload(10)
            # The kept-alive connection dies on the next request before any response byte:
            # the pool retries on a fresh connection.
            assert (await get(pool, server, "/fail-reused/20")).body == payload(20)
            assert server.connections == 2

            # A fresh connection that fails is not retried...
            with pytest.raises(ConnectionFailed) as info:
                await get(pool, server, "/silent-close")
            assert server.connections == 3
            assert info.value.stage == "fetch"
            assert info.value.url == "test:///silent-close"
            # ...and a reused one is retried exactly once.
            await get(pool, server, "/len/1")
            before = server.connections
            with pytest.raises(ConnectionFailed):
                await get(pool, server, "/silent-close")
            assert server.connections == before + 1

    run(main)


def test_no_retry_after_response_bytes(run: Runner) -> None:
    async def main() -> None:
        async with Server() as server, ConnectionPool() as pool:
            await get(pool, server, "/len/1")
            with pytest.raises(ConnectionFailed, match="inside the response headers"):
                await get(pool, server, "/half-head")
            assert server.connections == 1

    run(main)


def test_idle_connection_closed_by_server(run: Runner) -> None:
    async def main() -> None:
        async with Server() as server, ConnectionPool() as pool:
            assert (await get(pool, server, "/idle-close/10")).body == payload(10)
            await asyncio.sleep(0.1)  # the server closes the idle connection meanwhile
            assert (await get(pool, server, "/len/30")).body == payload(30)
            assert server.connections == 2

    run(main)


def test_reset_mid_body(run: Runner) -> None:
    async def main() -> None:
        async with Server() as server, ConnectionPool() as pool:
            with pytest.raises(ConnectionFailed) as info:
                await get(pool, server, "/reset/2000000")
            assert info.value.cause == "ConnectionReset"
            assert info.value.retryable
            assert (await get(pool, server, "/len/5")).body == payload(5)

    run(main)


def test_truncated_body(run: Runner) -> None:
    async def main() -> None:
        async with Server() as server, ConnectionPool() as pool:
            with pytest.raises(IncompleteBody, match="got 50000 of 100000 bytes"):
                await get(pool, server, "/truncate/100000")

    run(main)


def test_read_stall_timeout(run: Runner) -> None:
    async def main() -> None:
        timeouts = Timeouts(connect=5, first_byte=5, read=0.2)
        async with Server() as server, ConnectionPool(timeouts=timeouts) as pool:
            start = time.monotonic()
            with pytest.raises(FetchTimeout) as info:
                await get(pool, server, "/stall/100000")
            assert info.value.cause == "ReadTimeout"
            assert isinstance(info.value, TimeoutError)
            assert 0.15 < time.monotonic() - start < 2

    run(main)


def test_read_timeout_is_a_stall_limit_not_a_total(run: Runner) -> None:
    async def main() -> None:
        timeouts = Timeouts(connect=5, first_byte=0.3, read=0.3)
        async with Server() as server, ConnectionPool(timeouts=timeouts) as pool:
            start = time.monotonic()
            assert (await get(pool, server, "/trickle/5000")).body == payload(5000)
            assert time.monotonic() - start > 0.5  # longer than the read timeout in all
            assert server.connections == 1

    run(main)


def test_first_byte_timeout(run: Runner) -> None:
    async def main() -> None:
        timeouts = Timeouts(connect=5, first_byte=0.2, read=5)
        async with Server() as server, ConnectionPool(timeouts=timeouts) as pool:
            start = time.monotonic()
            with pytest.raises(FetchTimeout) as info:
                await get(pool, server, "/first-byte/3")
            assert info.value.cause == "FirstByteTimeout"
            assert 0.15 < time.monotonic() - start < 2
            # A slow first byte within the limit is fine.
            assert (await get(pool, server, "/first-byte/0.05")).body == payload(10)

    run(main)


def test_connection_refused(run: Runner) -> None:
    async def main() -> None:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        async with ConnectionPool() as pool:
            with pytest.raises(ConnectionFailed) as info:
                await pool.get("http", "127.0.0.1", port, "/", [], url="s3://b/k")
            assert info.value.cause == "ConnectionRefused"
            assert isinstance(info.value.__cause__, OSError)

    run(main)


def test_connect_timeout(run: Runner) -> None:
    async def main() -> None:
        # A listener whose accept queue is full drops new SYNs: connect() hangs.
        with contextlib.ExitStack() as stack:
            listener = stack.enter_context(socket.socket())
            listener.bind(("127.0.0.1", 0))
            listener.listen(0)
            port = listener.getsockname()[1]
            for _ in range(4):
                filler = stack.enter_context(socket.socket())
                filler.setblocking(False)
                with contextlib.suppress(BlockingIOError):
                    filler.connect(("127.0.0.1", port))
            timeouts = Timeouts(connect=0.2)
            async with ConnectionPool(timeouts=timeouts, max_connections=1) as pool:
                with pytest.raises(FetchTimeout) as info:
                    await pool.get("http", "127.0.0.1", port, "/", [], url="s3://b/k")
                assert info.value.cause == "ConnectTimeout"
                # The failed connect gave its slot back.
                with pytest.raises(FetchTimeout):
                    await pool.get("http", "127.0.0.1", port, "/", [], url="s3://b/k")

    run(main)


def test_idle_connections_of_other_hosts_are_evicted(run: Runner) -> None:
    async def main() -> None:
        async with Server() as first, Server() as second, ConnectionPool(max_connections=1) as pool:
            for _ in range(2):
                assert (await get(pool, first, "/len/10")).body == payload(10)
                assert (await get(pool, second, "/len/20")).body == payload(20)
            assert (first.connections, second.connections) == (2, 2)

    run(main)


def test_max_bytes(run: Runner) -> None:
    async def main() -> None:
        async with Server() as server, ConnectionPool() as pool:
            assert (await get(pool, server, "/len/1000", max_bytes=1000)).body == payload(1000)
            with pytest.raises(ObjectTooLarge, match="1001"):
                await get(pool, server, "/len/1001", max_bytes=1000)
            with pytest.raises(ObjectTooLarge):
                await get(pool, server, "/chunked/300000", max_bytes=100_000)
            with pytest.raises(ObjectTooLarge):
                await get(pool, server, "/until-close/300000", max_bytes=100_000)
            assert (await get(pool, server, "/chunked/1000", max_bytes=1000)).body == payload(1000)
            assert not ObjectTooLarge.retryable

    run(main)


def test_malformed_response(run: Runner) -> None:
    async def main() -> None:
        async with Server() as server, ConnectionPool() as pool:
            with pytest.raises(ConnectionFailed) as info:
                await get(pool, server, "/garbage")
            assert info.value.cause == "MalformedResponse"

    run(main)


def test_cancellation_releases_the_slot(run: Runner) -> None:
    async def main() -> None:
        async with Server() as server, ConnectionPool(max_connections=1) as pool:
            task = asyncio.ensure_future(get(pool, server, "/first-byte/10"))
            await asyncio.sleep(0.1)
            waiting = asyncio.ensure_future(get(pool, server, "/len/3"))
            await asyncio.sleep(0.05)
            assert not waiting.done()  # the only slot is taken
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            response = await asyncio.wait_for(waiting, 2)
            assert response.body == payload(3)
            assert server.connections == 2
            # The cancelled request's connection was closed, not pooled: one open, one idle.
            assert repr(pool) == "<ConnectionPool 1/1 open, 1 idle>"

    run(main)


def test_close_is_idempotent_and_leaks_no_sockets(run: Runner) -> None:
    async def main() -> None:
        await asyncio.sleep(0)
        before = open_sockets()
        async with Server() as server:
            pool = ConnectionPool(max_connections=8)
            await asyncio.gather(*(get(pool, server, f"/slow/{i}") for i in range(20)))
            stuck = asyncio.ensure_future(get(pool, server, "/first-byte/10"))
            await asyncio.sleep(0.05)
            assert open_sockets() - before
            await pool.close()
            await pool.close()
            assert pool.closed
            with pytest.raises(RuntimeError, match="pool is closed"):
                await stuck
            with pytest.raises(RuntimeError, match="pool is closed"):
                await get(pool, server, "/len/1")
        assert open_sockets() <= before

    run(main)


def test_close_wakes_waiters(run: Runner) -> None:
    async def main() -> None:
        async with Server() as server:
            pool = ConnectionPool(max_connections=1)
            busy = asyncio.ensure_future(get(pool, server, "/first-byte/10"))
            await asyncio.sleep(0.05)
            waiting = asyncio.ensure_future(get(pool, server, "/len/1"))
            await asyncio.sleep(0.05)
            await pool.close()
            for task in (busy, waiting):
                with pytest.raises(RuntimeError, match="pool is closed"):
                    await task

    run(main)


def test_bad_requests_are_rejected(run: Runner) -> None:
    async def main() -> None:
        async with ConnectionPool() as pool:
            for target, headers in [
                ("/a b", []),
                ("no-slash", []),
                ("/ok", [("x-evil", "1\r\nInjected: yes")]),
                ("/ok\r\nInjected: yes", []),
                ("/ünicode", []),
            ]:
                with pytest.raises(ConfigError):
                    await pool.get("http", "127.0.0.1", 1, target, headers, url="x")
            with pytest.raises(ConfigError):
                await pool.get("ftp", "127.0.0.1", 1, "/", [], url="x")
        with pytest.raises(ConfigError):
            ConnectionPool(max_connections=0)

    run(main)


def test_given_host_header_is_kept(run: Runner) -> None:
    async def main() -> None:
        async with Server() as server, ConnectionPool() as pool:
            await pool.get(
                "http", "127.0.0.1", server.port, "/len/1", [("HOST", "example.com")], url="x"
            )
            assert server.requests[0][1]["host"] == "example.com"

    run(main)


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("needs the openssl CLI to make a self-signed certificate")
    folder = tmp_path_factory.mktemp("tls")
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(
        [openssl, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
         "-nodes", "-keyout", str(key), "-out", str(cert), "-days", "1", "-subj", "/CN=127.0.0.1",
         "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"],
        check=True,
        capture_output=True,
    )  # fmt: skip
    return cert, key


def test_tls(run: Runner, certificate: tuple[Path, Path]) -> None:
    cert, key = certificate

    async def main() -> None:
        server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        server_context.load_cert_chain(cert, key)
        client_context = ssl.create_default_context(cafile=str(cert))
        async with Server(server_context) as server:
            async with ConnectionPool(ssl_context=client_context) as pool:
                for n in [0, 10, 110_000, 1_000_000]:
                    assert (await get(pool, server, f"/len/{n}")).body == payload(n)
                assert (await get(pool, server, "/chunked/50000")).body == payload(50000)
                assert server.connections == 1
            # The system trust store does not know our self-signed certificate.
            async with ConnectionPool() as pool:
                with pytest.raises(ConnectionFailed) as info:
                    await get(pool, server, "/len/1")
                assert info.value.cause == "TLSFailed"

    run(main)
