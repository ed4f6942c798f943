"""ConnectionPool against real local HTTP/1.1 servers, on asyncio and on uvloop: reuse,
the bound on connections, FIFO waiting, the one retry of a stale connection, cancellation,
close, connecting (refused, timeout, TLS)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
from pathlib import Path
from typing import Any

import pytest

from concurrent_loader.config import Timeouts
from concurrent_loader.errors import (
    CertificateRefused,
    ConfigError,
    ConnectionFailed,
    FetchTimeout,
)
from concurrent_loader.transport import ConnectionPool, Origin, Response

from ._server import Recorders, Server, open_sockets, origin_of, payload
from .conftest import Runner


async def get(pool: ConnectionPool, server: Server, path: str, **kwargs: Any) -> Response:
    return await pool.get(origin_of(server), path, [], url=f"test://{path}", **kwargs)


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


def test_the_stale_connection_retry_feeds_one_fresh_digest_the_whole_body(run: Runner) -> None:
    async def main() -> None:
        async with Server() as server, ConnectionPool() as pool:
            await get(pool, server, "/fail-reused/10")
            recorders = Recorders()
            response = await get(pool, server, "/fail-reused/200000", digest_for=recorders)
            assert server.connections == 2  # the reused connection failed, a fresh one served
            [recorder] = recorders.made
            assert response.digest is recorder
            assert recorder.data == response.body == payload(200_000)

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
            # The server closes the idle connection meanwhile.
            await server.wait_until(lambda: server.closed_connections == 1)
            assert (await get(pool, server, "/len/30")).body == payload(30)
            assert server.connections == 2

    run(main)


def test_connection_refused(run: Runner) -> None:
    async def main() -> None:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        async with ConnectionPool() as pool:
            with pytest.raises(ConnectionFailed) as info:
                await pool.get(Origin("http", "127.0.0.1", port), "/", [], url="s3://b/k")
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
                    await pool.get(Origin("http", "127.0.0.1", port), "/", [], url="s3://b/k")
                assert info.value.cause == "ConnectTimeout"
                # The failed connect gave its slot back.
                with pytest.raises(FetchTimeout):
                    await pool.get(Origin("http", "127.0.0.1", port), "/", [], url="s3://b/k")

    run(main)


def test_idle_connections_of_other_hosts_are_evicted(run: Runner) -> None:
    async def main() -> None:
        async with Server() as first, Server() as second, ConnectionPool(max_connections=1) as pool:
            for _ in range(2):
                assert (await get(pool, first, "/len/10")).body == payload(10)
                assert (await get(pool, second, "/len/20")).body == payload(20)
            assert (first.connections, second.connections) == (2, 2)

    run(main)


def test_cancellation_releases_the_slot(run: Runner) -> None:
    async def main() -> None:
        async with Server() as server, ConnectionPool(max_connections=1) as pool:
            task = asyncio.ensure_future(get(pool, server, "/first-byte/10"))
            await server.wait_for_requests(1)
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
            await server.wait_for_requests(21)
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
            await server.wait_for_requests(1)
            waiting = asyncio.ensure_future(get(pool, server, "/len/1"))
            await asyncio.sleep(0.05)  # it queues for the only slot
            await pool.close()
            for task in (busy, waiting):
                with pytest.raises(RuntimeError, match="pool is closed"):
                    await task

    run(main)


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
                with pytest.raises(CertificateRefused) as info:
                    await get(pool, server, "/len/1")
                assert info.value.cause == "CertificateRefused"
                assert not info.value.retryable

    run(main)


def test_max_connections_is_validated() -> None:
    for bad in (0, -1, True, 2.0, "8"):
        with pytest.raises(ConfigError) as info:
            ConnectionPool(max_connections=bad)  # type: ignore[arg-type]
        assert info.value.cause == "InvalidArgument"


def test_a_connection_is_kept_per_origin(run: Runner) -> None:
    async def main() -> None:
        async with Server() as server, ConnectionPool() as pool:
            # Two spellings of one origin share a connection; another port would not.
            by_name = Origin.from_url(f"http://127.0.0.1:{server.port}/a/b")
            for origin in (by_name, origin_of(server), by_name):
                response = await pool.get(origin, "/len/5", [], url="x")
                assert response.body == payload(5)
            assert server.connections == 1

    run(main)
