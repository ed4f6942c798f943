"""The HTTP/1.1 connection against a real local server, on asyncio and on uvloop: every
framing of a response body, partial content, and every failure inside one exchange turned
into its typed error."""

from __future__ import annotations

import time
from typing import Any

import pytest

from concurrent_loader.config import Timeouts
from concurrent_loader.errors import (
    BadRequest,
    ConnectionFailed,
    FetchTimeout,
    IncompleteBody,
    ObjectTooLarge,
)
from concurrent_loader.transport import ConnectionPool, Origin, Response

from ._server import Recorders, Server, origin_of, payload
from .conftest import Runner


async def get(pool: ConnectionPool, server: Server, path: str, **kwargs: Any) -> Response:
    return await pool.get(origin_of(server), path, [], url=f"test://{path}", **kwargs)


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


OBJECT = 100_000


def test_ranged_get_returns_exactly_the_range(run: Runner) -> None:
    whole = payload(OBJECT)

    async def main() -> None:
        async with Server() as server, ConnectionPool() as pool:
            for route in ("range", "range-chunked", "range-bare", "range-200", "range-200-chunked"):
                for start, end in [(0, 1), (5, 1000), (0, OBJECT), (OBJECT - 1, OBJECT)]:
                    path = f"/{route}/{OBJECT}"
                    response = await get(pool, server, path, byte_range=(start, end))
                    assert response.status == (200 if "200" in route else 206)
                    assert response.body == whole[start:end]
                    assert server.requests[-1][1]["range"] == f"bytes={start}-{end - 1}"
            # Every 206 was read to its end, so the one connection was kept throughout.
            assert server.connections == 1

    run(main)


@pytest.mark.parametrize(
    ("path", "byte_range", "detail"),
    [
        ("/range-shifted/1000", (10, 20), "got Content-Range 'bytes 11-20/1000'"),
        ("/range-long/1000", (10, 20), "the response has 11"),
        ("/range-bare-chunked-long/1000", (10, 20), "the response has 11"),
        # A range past the end comes back clamped by the server: not the range asked for.
        ("/range/1000", (990, 1010), "got Content-Range 'bytes 990-999/1000'"),
        ("/range-200/1000", (990, 1010), "got Content-Range 'bytes 990-999/1000'"),
    ],
)
def test_ranged_get_refuses_anything_but_the_range(
    run: Runner, path: str, byte_range: tuple[int, int], detail: str
) -> None:
    async def main() -> None:
        async with Server() as server, ConnectionPool() as pool:
            with pytest.raises(ConnectionFailed) as info:
                await get(pool, server, path, byte_range=byte_range)
            assert info.value.cause == "MalformedResponse"
            assert (info.value.stage, info.value.url) == ("fetch", f"test://{path}")
            assert detail in str(info.value)
            # The connection was closed, never pooled: its framing cannot be trusted.
            assert repr(pool) == "<ConnectionPool 0/256 open, 0 idle>"

    run(main)


def test_ranged_get_refuses_the_whole_object(run: Runner) -> None:
    async def main() -> None:
        async with Server() as server, ConnectionPool() as pool:
            with pytest.raises(BadRequest) as info:
                await get(pool, server, "/range-ignored/1000", byte_range=(10, 20))
            assert (info.value.cause, info.value.status) == ("BadRequest", 200)
            assert not info.value.retryable  # the server will ignore Range again
            assert "ignored the range" in str(info.value)
            # Refused from its head: the 1000-byte body was never read into memory.
            assert repr(pool) == "<ConnectionPool 0/256 open, 0 idle>"
            # Without a range the same object is an ordinary 200.
            response = await get(pool, server, "/range-ignored/1000")
            assert (response.status, response.body) == (200, payload(1000))

    run(main)


def test_ranged_get_statuses_other_than_success_are_returned(run: Runner) -> None:
    async def main() -> None:
        async with Server() as server, ConnectionPool() as pool:
            response = await get(pool, server, "/range/100", byte_range=(200, 300))
            assert response.status == 416
            response = await get(pool, server, "/status/404", byte_range=(0, 10))
            assert response.status == 404
            assert server.connections == 1

    run(main)


def test_ranged_get_max_bytes_bounds_the_range(run: Runner) -> None:
    async def main() -> None:
        async with Server() as server, ConnectionPool() as pool:
            path = f"/range/{OBJECT}"
            response = await get(pool, server, path, byte_range=(0, 1000), max_bytes=1000)
            assert response.body == payload(OBJECT)[:1000]
            with pytest.raises(ObjectTooLarge):
                await get(pool, server, path, byte_range=(0, 1001), max_bytes=1000)

    run(main)


def test_host_header_comes_from_the_origin(run: Runner) -> None:
    async def main() -> None:
        async with Server() as server, ConnectionPool() as pool:
            for host in ("127.0.0.1", "localhost"):
                origin = Origin("http", host, server.port)
                await pool.get(origin, "/len/1", [("x-a", "1")], url="x")
                assert server.requests[-1][1]["host"] == f"{host}:{server.port}"

    run(main)


@pytest.mark.parametrize(
    ("path", "byte_range", "size"),
    [
        ("/len/0", None, 0),
        ("/len/100", None, 100),  # the whole body arrives with the head
        ("/len/1000003", None, 1_000_003),
        ("/trickle/300000", None, 300_000),  # many reads into the body buffer
        ("/continue/5000", None, 5000),  # the digest is made for the final head only
        ("/chunked/300001", None, 300_001),
        ("/until-close/200000", None, 200_000),
        ("/range/300000", (1000, 250_000), 249_000),
        ("/range-chunked/300000", (7, 150_000), 149_993),
    ],
)
def test_a_digest_is_fed_every_body_byte_once_in_order(
    run: Runner, path: str, byte_range: tuple[int, int] | None, size: int
) -> None:
    async def main() -> None:
        async with Server() as server, ConnectionPool() as pool:
            for _ in range(2):  # a fresh digest per response on a kept-alive connection
                recorders = Recorders()
                response = await get(
                    pool, server, path, byte_range=byte_range, digest_for=recorders
                )
                assert len(response.body) == size
                [recorder] = recorders.made
                assert response.digest is recorder
                assert recorder.status == response.status
                assert recorder.headers == response.headers
                assert recorder.data == response.body
                assert all(recorder.pieces)
                if path.startswith("/trickle"):
                    assert len(recorder.pieces) > 1

    run(main)


def test_without_a_digest_the_response_has_none(run: Runner) -> None:
    async def main() -> None:
        async with Server() as server, ConnectionPool() as pool:
            assert (await get(pool, server, "/len/10")).digest is None
            declined = await get(pool, server, "/len/10", digest_for=lambda status, headers: None)
            assert declined.digest is None and declined.body == payload(10)

    run(main)


@pytest.mark.parametrize("fails", ["digest_for", "update"])
def test_a_digest_that_raises_fails_the_get_and_its_connection(run: Runner, fails: str) -> None:
    class Broken(Exception):
        pass

    class Refusing:
        def update(self, data: memoryview, /) -> None:
            raise Broken("refused")

    def digest_for(status: int, headers: dict[str, str]) -> Refusing:
        if fails == "digest_for":
            raise Broken("no digest")
        return Refusing()

    async def main() -> None:
        async with Server() as server, ConnectionPool() as pool:
            for path in ("/len/110000", "/chunked/5000", "/len/10"):
                with pytest.raises(Broken):
                    await get(pool, server, path, digest_for=digest_for)
            assert (await get(pool, server, "/len/10")).body == payload(10)
            # Every failed response closed its connection.
            assert server.connections == 4

    run(main)
