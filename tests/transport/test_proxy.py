"""The transport through a forward proxy on loopback: absolute-form requests for http,
CONNECT tunnels with TLS inside for https, proxy credentials sent and never shown."""

from __future__ import annotations

import ssl
from pathlib import Path

import pytest

from concurrent_loader.config import Timeouts
from concurrent_loader.errors import AccessDenied, ConfigError
from concurrent_loader.transport import ConnectionPool, Proxy

from ._proxy import ForwardProxy
from ._server import Server, origin_of, payload
from .conftest import Runner

SECRET = "s3cret"
# base64("user:s3cret")
BASIC = "Basic dXNlcjpzM2NyZXQ="


def make(proxy: str, ssl_context: ssl.SSLContext | None = None) -> ConnectionPool:
    return ConnectionPool(
        max_connections=4, timeouts=Timeouts(), ssl_context=ssl_context, proxy=Proxy.from_url(proxy)
    )


def test_plain_http_goes_through_the_proxy_in_absolute_form(run: Runner) -> None:
    async def main() -> None:
        async with Server() as server, ForwardProxy(authorization=BASIC) as proxy:
            transport = make(proxy.url(f"user:{SECRET}@"))
            try:
                origin = origin_of(server)
                for n in (10, 100_000):
                    response = await transport.get(origin, f"/len/{n}", [], url="test://x")
                    assert response.status == 200 and bytes(response.body) == payload(n)
            finally:
                await transport.close()
            assert proxy.heads[0] == (f"GET http://127.0.0.1:{server.port}/len/10 HTTP/1.1", BASIC)
            assert server.absolute_targets[-1] == f"http://127.0.0.1:{server.port}/len/100000"

    run(main)


def test_https_is_tunnelled_with_connect_and_tls_inside(
    run: Runner, certificate: tuple[Path, Path]
) -> None:
    cert, key = certificate

    async def main() -> None:
        server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        server_context.load_cert_chain(cert, key)
        client_context = ssl.create_default_context(cafile=str(cert))
        async with Server(server_context) as server, ForwardProxy(authorization=BASIC) as proxy:
            transport = make(proxy.url(f"user:{SECRET}@"), client_context)
            try:
                for n in (10, 200_000):
                    response = await transport.get(
                        origin_of(server), f"/len/{n}", [], url="test://x"
                    )
                    assert response.status == 200 and bytes(response.body) == payload(n)
            finally:
                await transport.close()
            assert proxy.heads[0] == (f"CONNECT 127.0.0.1:{server.port} HTTP/1.1", BASIC)
            # The proxy only saw the CONNECT: the GETs went inside the TLS tunnel.
            assert all(line.startswith("CONNECT ") for line, _ in proxy.heads)
            assert server.absolute_targets == []

    run(main)


def test_a_proxy_that_wants_other_credentials_is_access_denied_without_echoing_ours(
    run: Runner, certificate: tuple[Path, Path]
) -> None:
    cert, key = certificate

    async def main() -> None:
        server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        server_context.load_cert_chain(cert, key)
        client_context = ssl.create_default_context(cafile=str(cert))
        async with Server(server_context) as server, ForwardProxy(authorization="Basic x") as proxy:
            transport = make(proxy.url(f"user:{SECRET}@"), client_context)
            try:
                with pytest.raises(AccessDenied) as info:
                    await transport.get(origin_of(server), "/len/1", [], url="s3://b/k")
            finally:
                await transport.close()
        error = info.value
        assert (error.cause, error.status, error.url) == ("ProxyRefused", 407, "s3://b/k")
        assert not error.retryable
        assert SECRET not in str(error) and "dXNlcjpzM2NyZXQ" not in str(error)

    run(main)


def test_proxy_urls() -> None:
    proxy = Proxy.from_url(f"http://user:{SECRET}@proxy.internal:3128")
    assert (proxy.origin.host, proxy.origin.port, proxy.authorization) == (
        "proxy.internal",
        3128,
        BASIC,
    )
    assert SECRET not in repr(proxy) and "dXNlcjpzM2NyZXQ" not in repr(proxy)
    assert Proxy.from_url("proxy.internal:3128").origin.port == 3128  # HTTP_PROXY without scheme
    assert (
        Proxy.from_url("http://[::1]:8080")
        .connect_request(Proxy.from_url("http://[::1]:8080").origin)
        .startswith(b"CONNECT [::1]:8080 HTTP/1.1\r\n")
    )
    with pytest.raises(ConfigError, match="not supported"):
        Proxy.from_url("https://proxy.internal")
    with pytest.raises(ConfigError):
        Proxy.from_url("")
