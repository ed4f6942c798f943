"""The HTTP transports a reader can send its GETs through.

Both implement :class:`Transport`: a pooled, bounded HTTP client whose ``get`` returns the
status, the headers (lower-cased names) and the whole body, raises
``ConnectionFailed``/``IncompleteBody``/``FetchTimeout``/``ObjectTooLarge`` for transport
failures, and leaves non-2xx statuses to the caller.

- ``"http1"`` (default): :class:`~concurrent_loader.fetch.http1.ConnectionPool`, our lean
  HTTP/1.1 client on ``asyncio.BufferedProtocol`` that writes bodies straight into one
  buffer; the cheapest per GET.
- ``"aiohttp"``: aiohttp's client, for environments that need its features (proxies from
  the environment, HTTP features beyond plain GETs).
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Mapping, Sequence
from typing import Protocol

from ..config import FetchConfig
from ..errors import FetchError, FetchTimeout, IncompleteBody, ObjectTooLarge, Reason
from .translate import error_for_exception

__all__ = ["AiohttpTransport", "Transport", "TransportResponse", "make_transport"]


class TransportResponse(Protocol):
    @property
    def status(self) -> int: ...
    @property
    def headers(self) -> Mapping[str, str]: ...
    @property
    def body(self) -> bytes | bytearray: ...
    @property
    def first_byte_s(self) -> float | None: ...


class Transport(Protocol):
    async def get(
        self,
        scheme: str,
        host: str,
        port: int,
        target: str,
        headers: Sequence[tuple[str, str]],
        *,
        url: str,
        max_bytes: int | None = None,
    ) -> TransportResponse: ...

    async def close(self) -> None: ...


class _Response:
    __slots__ = ("body", "first_byte_s", "headers", "status")

    def __init__(self, status: int, headers: Mapping[str, str], body: bytes) -> None:
        self.status = status
        self.headers = headers
        self.body = body
        self.first_byte_s: float | None = None  # aiohttp does not tell


class AiohttpTransport:
    """aiohttp behind the :class:`Transport` contract."""

    def __init__(self, config: FetchConfig, ssl_context: ssl.SSLContext | None) -> None:
        import aiohttp

        self._aiohttp = aiohttp
        t = config.timeouts
        self._timeout = aiohttp.ClientTimeout(
            total=None, sock_connect=t.connect, sock_read=max(t.read, t.first_byte)
        )
        connector = aiohttp.TCPConnector(
            limit=config.max_inflight_requests,
            ssl=ssl_context if ssl_context is not None else config.verify_tls,
        )
        self._session = aiohttp.ClientSession(
            connector=connector, timeout=self._timeout, auto_decompress=False
        )

    async def get(
        self,
        scheme: str,
        host: str,
        port: int,
        target: str,
        headers: Sequence[tuple[str, str]],
        *,
        url: str,
        max_bytes: int | None = None,
    ) -> _Response:
        from yarl import URL

        request_url = URL(f"{scheme}://{host}:{port}{target}", encoded=True)
        try:
            async with self._session.get(
                request_url, headers=dict(headers), allow_redirects=False
            ) as response:
                length = response.content_length
                if max_bytes is not None and length is not None and length > max_bytes:
                    raise ObjectTooLarge(
                        f"{length} bytes > max_object_bytes={max_bytes}",
                        url=url,
                        stage="fetch",
                        cause=Reason.OBJECT_TOO_LARGE,
                    )
                body = await response.read()
                if length is not None and len(body) < length:
                    raise IncompleteBody(
                        f"got {len(body)} of {length} bytes",
                        url=url,
                        stage="fetch",
                        cause=Reason.INCOMPLETE_BODY,
                    )
                return _Response(response.status, dict(response.headers), body)
        except FetchError:
            raise
        except (TimeoutError, self._aiohttp.ClientError, OSError) as exc:
            if isinstance(exc, asyncio.TimeoutError):
                raise FetchTimeout(
                    "no data within the timeout", url=url, stage="fetch", cause=Reason.TIMED_OUT
                ) from exc
            raise error_for_exception(exc, url) from exc

    async def close(self) -> None:
        await self._session.close()


def make_transport(name: str, config: FetchConfig, ssl_context: ssl.SSLContext | None) -> Transport:
    if name == "aiohttp":
        return AiohttpTransport(config, ssl_context)
    if name == "http1":
        from .http1 import ConnectionPool

        return ConnectionPool(
            max_connections=config.max_inflight_requests,
            timeouts=config.timeouts,
            ssl_context=ssl_context,
        )
    raise ValueError(f"unknown transport {name!r}: expected 'http1' or 'aiohttp'")
