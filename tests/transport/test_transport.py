"""The transport contract (the package docstring), checked on ConnectionPool against the
local test server; and that the package knows HTTP only."""

from __future__ import annotations

import ast
import asyncio
import gc
import socket
import ssl
from pathlib import Path
from typing import Any

import pytest

import concurrent_loader.transport as transport_package
from concurrent_loader.config import Timeouts
from concurrent_loader.errors import (
    BadRequest,
    ConfigError,
    ConnectionFailed,
    FetchError,
    IncompleteBody,
    ObjectTooLarge,
)
from concurrent_loader.transport import (
    ConnectionPool,
    Origin,
    Response,
)

from ._server import Server, origin_of, payload
from .conftest import Runner


def make() -> ConnectionPool:
    return ConnectionPool(max_connections=8, timeouts=Timeouts(), ssl_context=None)


async def get(transport: ConnectionPool, server: Server, path: str, **kwargs: Any) -> Response:
    return await transport.get(origin_of(server), path, [], url=f"test://{path}", **kwargs)


def test_whole_objects_and_their_headers(run: Runner) -> None:
    async def main() -> None:
        transport = make()
        try:
            async with Server() as server:
                for path, n in [("/len/0", 0), ("/len/100000", 100_000), ("/chunked/5000", 5000)]:
                    response = await get(transport, server, path)
                    assert (response.status, response.body) == (200, payload(n))
                response = await get(transport, server, "/status/404")
                assert response.status == 404  # returned, not raised
                assert response.headers["x-dup"] == "a, b"  # lower-case names, repeats joined
                assert response.headers["content-length"] == str(len(response.body))
                assert {h["host"] for _, h in server.requests} == {f"127.0.0.1:{server.port}"}
        finally:
            await transport.close()

    run(main)


def test_a_callers_host_header_is_refused(run: Runner) -> None:
    async def main() -> None:
        transport = make()
        try:
            origin = Origin("http", "127.0.0.1", 1)
            with pytest.raises(ConfigError, match="Host"):
                await transport.get(origin, "/k", [("Host", "example.com")], url="x")
        finally:
            await transport.close()

    run(main)


def test_ranged_gets(run: Runner) -> None:
    whole = payload(10_000)

    async def main() -> None:
        transport = make()
        try:
            async with Server() as server:
                for route in ("range", "range-chunked", "range-bare"):
                    response = await get(transport, server, f"/{route}/10000", byte_range=(5, 905))
                    assert (response.status, response.body) == (206, whole[5:905])
                    assert server.requests[-1][1]["range"] == "bytes=5-904"
                for path in ("/range-shifted/10000", "/range-long/10000", "/range/910"):
                    with pytest.raises(ConnectionFailed) as failed:
                        await get(transport, server, path, byte_range=(5, 915))
                    assert failed.value.cause == "MalformedResponse"
                    assert (failed.value.url, failed.value.stage) == (f"test://{path}", "fetch")
                with pytest.raises(BadRequest) as refused:
                    await get(transport, server, "/range-ignored/10000", byte_range=(5, 905))
                assert (refused.value.cause, refused.value.status) == ("BadRequest", 200)
                response = await get(transport, server, "/range/100", byte_range=(200, 300))
                assert response.status == 416
                with pytest.raises(ObjectTooLarge):
                    await get(transport, server, "/range/10000", byte_range=(0, 101), max_bytes=100)
        finally:
            await transport.close()

    run(main)


def test_transport_failures_are_typed(run: Runner) -> None:
    async def main() -> None:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        transport = make()
        try:
            async with Server() as server:
                with pytest.raises(IncompleteBody) as incomplete:
                    await get(transport, server, "/truncate/100000")
                assert incomplete.value.cause == "IncompleteBody"
                assert incomplete.value.retryable
                with pytest.raises(ObjectTooLarge):
                    await get(transport, server, "/len/1001", max_bytes=1000)
            with pytest.raises(ConnectionFailed) as refused:
                await transport.get(Origin("http", "127.0.0.1", port), "/", [], url="s3://b/k")
            assert (refused.value.url, refused.value.stage) == ("s3://b/k", "fetch")
            assert refused.value.retryable
        finally:
            await transport.close()

    run(main)


# Everything the package may import: HTTP and sockets, never a store's client or format.
_ALLOWED_IMPORTS = {
    "__future__",
    "asyncio",
    "base64",
    "collections",
    "ctypes",
    "dataclasses",
    "select",
    "socket",
    "ssl",
    "typing",
    "urllib",
    "warnings",
    "weakref",
    "yarl",
    "concurrent_loader.config",
    "concurrent_loader.errors",
}


def test_the_package_knows_http_only() -> None:
    folder = Path(transport_package.__file__).parent
    for path in sorted(folder.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                modules = [node.module]
            else:
                continue
            for module in modules:
                allowed = module in _ALLOWED_IMPORTS or module.split(".")[0] in _ALLOWED_IMPORTS
                assert allowed, f"{path.name} imports {module}"


@pytest.mark.parametrize(
    ("path", "body"),
    [
        # In one write with the response: a 1000-byte body arrives in the same read as the
        # bytes after it; a 100 kB one is read to its exact end, and they wait in the socket.
        ("/trailing/1000", payload(1000)),
        ("/trailing/100000", payload(100_000)),
        # While the connection sits idle, after each way a response can end.
        ("/stray-after/len/1000", payload(1000)),
        ("/stray-after/len/100000", payload(100_000)),
        ("/stray-after/chunked/5000", payload(5000)),
        ("/stray-after/continue/1000", payload(1000)),
        ("/stray-after/status/304", b""),
    ],
)
def test_bytes_after_a_complete_response_are_never_read_as_the_next_one(
    run: Runner, path: str, body: bytes
) -> None:
    # The next GET goes out as soon as the unasked-for response is on its way, before the
    # event loop has read it.
    async def main() -> None:
        async with Server() as server:
            transport = make()
            try:
                for sent in range(1, 4):
                    first = await get(transport, server, path)
                    assert bytes(first.body) == body
                    await server.wait_for_strays(sent)
                    other = 10 + sent
                    response = await get(transport, server, f"/len/{other}")
                    assert (response.status, bytes(response.body)) == (200, payload(other))
            finally:
                await transport.close()
            assert server.connections >= 4  # no polluted connection was reused

    run(main)


@pytest.mark.parametrize("tls", [False, True])
def test_a_clean_server_keeps_one_connection(
    run: Runner, tls: bool, request: pytest.FixtureRequest
) -> None:
    # The look for unread bytes before each reuse finds none on a server that sends none,
    # over TLS too (where the socket carries records besides the responses).
    server_context = client_context = None
    if tls:
        cert, key = request.getfixturevalue("certificate")
        server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        server_context.load_cert_chain(cert, key)
        client_context = ssl.create_default_context(cafile=str(cert))

    async def main() -> None:
        async with Server(server_context) as server:
            transport = ConnectionPool(
                max_connections=8, timeouts=Timeouts(), ssl_context=client_context
            )
            try:
                for n in [*range(20), 100_000, 1_000_000]:
                    response = await get(transport, server, f"/len/{n}")
                    assert bytes(response.body) == payload(n)
                response = await get(transport, server, "/chunked/50000")
                assert bytes(response.body) == payload(50000)
            finally:
                await transport.close()
            assert server.connections == 1

    run(main)


def test_concurrent_gets_never_read_bytes_past_another_response(run: Runner) -> None:
    # Every response is followed by an unasked-for one in the same write; 48 GETs of distinct
    # objects share 8 connections, each reused as soon as it is released.
    async def main() -> None:
        async with Server() as server:
            transport = make()
            try:
                sizes = [20_000 + i for i in range(48)]
                responses = await asyncio.gather(
                    *(get(transport, server, f"/trailing/{n}") for n in sizes)
                )
            finally:
                await transport.close()
            for n, response in zip(sizes, responses, strict=True):
                assert bytes(response.body) == payload(n), f"/trailing/{n} got other bytes"

    run(main)


def test_a_transfer_coding_other_than_chunked_is_refused_not_retried(run: Runner) -> None:
    async def main() -> None:
        async with Server() as server:
            transport = make()
            try:
                with pytest.raises(FetchError) as caught:
                    await get(transport, server, "/te-gzip/100")
            finally:
                await transport.close()
        error = caught.value
        assert (error.cause, error.url, error.retryable) == (
            "UnsupportedEncoding",
            "test:///te-gzip/100",
            False,
        )
        assert "gzip, chunked" in str(error)

    run(main)


def test_no_transport_asks_for_an_encoded_body(run: Runner) -> None:
    # The body is handed over as the object's bytes, never decoded: a server asked for gzip
    # (nginx's gzip, a CDN, GCS for an object stored gzipped) would send bytes other than
    # the object's, and other bytes from each transport.
    async def main() -> None:
        async with Server() as server:
            transport = make()
            try:
                await get(transport, server, "/len/100")
            finally:
                await transport.close()
        [(_, headers)] = server.requests
        assert headers.get("accept-encoding", "identity") == "identity"

    run(main)


def test_a_response_that_is_not_http_is_malformed_on_every_transport(run: Runner) -> None:
    async def main() -> None:
        async with Server() as server:
            transport = make()
            try:
                with pytest.raises(ConnectionFailed) as caught:
                    await get(transport, server, "/garbage")
            finally:
                await transport.close()
        error = caught.value
        assert (error.cause, error.url, error.retryable) == (
            "MalformedResponse",
            "test:///garbage",
            True,
        )

    run(main)


# Longer than the 255 bytes a DNS name may have: the resolver refuses it without sending a
# query, so the lookup fails at once and offline, as a name that does not exist would.
UNRESOLVABLE = "a." * 127 + "invalid"


def test_a_failed_lookup_leaves_no_exception_unretrieved(run: Runner) -> None:
    # GETs to a host that does not resolve: cancelled while the lookup runs (a deadline, a
    # hedge that lost), cut short by the connect timeout, and one let fail.
    async def main() -> None:
        loop = asyncio.get_running_loop()
        unhandled: list[dict[str, Any]] = []
        loop.set_exception_handler(lambda _, context: unhandled.append(context))
        origin = Origin("http", UNRESOLVABLE, 9000)
        transport = ConnectionPool(max_connections=4, timeouts=Timeouts(), ssl_context=None)
        hurried = ConnectionPool(
            max_connections=4, timeouts=Timeouts(connect=0.0001), ssl_context=None
        )
        try:
            gets = [transport.get(origin, f"/{i}", [], url=f"s3://b/{i}") for i in range(8)]
            gets += [hurried.get(origin, f"/{i}", [], url=f"s3://b/{i}") for i in range(8)]
            await asyncio.gather(
                *(asyncio.wait_for(one, 0.0001) for one in gets[:8]),
                *gets[8:],
                return_exceptions=True,
            )
            with pytest.raises(FetchError) as failed:
                await transport.get(origin, "/k", [], url="s3://b/k")
            assert (failed.value.url, failed.value.stage) == ("s3://b/k", "fetch")
            assert UNRESOLVABLE in str(failed.value)
        finally:
            await transport.close()
            await hurried.close()
        # The lookups of the cancelled GETs end within milliseconds: give them the time,
        # then collect what nobody holds, which reports any exception never retrieved.
        await asyncio.sleep(0.2)
        gc.collect()
        assert unhandled == []

    run(main)
