"""The ``"aiohttp"`` transport: aiohttp's client behind the transport contract.

For environments that need aiohttp's features; it costs several times the CPU per GET of
:class:`~.pool.ConnectionPool`. It keeps the same contract (see
:mod:`concurrent_loader.transport`), with two differences aiohttp imposes: bodies are read
into ``bytes``, not written in place, and ``first_byte_s`` is ``None`` (aiohttp does not
tell when the first byte arrived).

One hazard it does not share with ``"http1"``: bytes a misbehaving server sends after a
complete response, arriving while the connection sits idle in aiohttp's pool, are kept by
aiohttp and read as the start of the next response on that connection. ``"http1"`` closes a
connection that receives any byte while idle.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Sequence

import aiohttp
from yarl import URL

from concurrent_loader.config import Timeouts
from concurrent_loader.errors import FetchError, FetchTimeout, IncompleteBody, Reason

from .errors import error_for_exception, framing_error, too_large
from .origin import Origin
from .parser import (
    UNTIL_CLOSE,
    FramingError,
    UnsupportedEncoding,
    check_partial,
    check_partial_length,
    transfer_codings,
)
from .proxy import Proxy
from .request import host_header_refused, range_value
from .response import Response

__all__ = ["AiohttpTransport"]


class AiohttpTransport:
    """aiohttp behind the :class:`~concurrent_loader.transport.Transport` contract.

    ``ssl_context`` ``None`` verifies certificates against the system's trust store.
    Create it inside the event loop that will use it.
    """

    def __init__(
        self,
        *,
        max_connections: int,
        timeouts: Timeouts,
        ssl_context: ssl.SSLContext | None,
        proxy: Proxy | None = None,
    ) -> None:
        self._proxy = None if proxy is None else URL(f"http://{proxy.origin.host_header}")
        # Sent with the CONNECT of an https origin; an http origin's requests go to the proxy
        # itself, so they carry them (aiohttp sends proxy_headers with CONNECT only).
        self._proxy_headers = None if proxy is None else proxy.headers()
        self._timeout = aiohttp.ClientTimeout(
            total=None,
            sock_connect=timeouts.connect,
            sock_read=max(timeouts.read, timeouts.first_byte),
        )
        connector = aiohttp.TCPConnector(
            limit=max_connections, ssl=ssl_context if ssl_context is not None else True
        )
        self._session = aiohttp.ClientSession(
            connector=connector, timeout=self._timeout, auto_decompress=False
        )

    async def get(
        self,
        origin: Origin,
        target: str,
        headers: Sequence[tuple[str, str]],
        *,
        url: str,
        max_bytes: int | None = None,
        byte_range: tuple[int, int] | None = None,
    ) -> Response:
        request_headers = [("Host", origin.host_header)]
        for name, value in headers:
            if len(name) == 4 and name.lower() == "host":
                raise host_header_refused()
            request_headers.append((name, value))
        if byte_range is not None:
            request_headers.append(("Range", range_value(byte_range)))
        if self._proxy_headers and not origin.tls:
            request_headers += self._proxy_headers
        request_url = URL(f"{origin.scheme}://{origin.host_header}{target}", encoded=True)
        try:
            async with self._session.get(
                request_url,
                headers=request_headers,
                allow_redirects=False,
                proxy=self._proxy,
                proxy_headers=dict(self._proxy_headers) if self._proxy_headers else None,
            ) as response:
                status = response.status
                response_headers: dict[str, str] = {}
                for name, value in response.headers.items():
                    name = name.lower()
                    previous = response_headers.get(name)
                    response_headers[name] = value if previous is None else f"{previous}, {value}"
                coding = response_headers.get("transfer-encoding")
                if coding is not None and transfer_codings(coding) not in ([], ["chunked"]):
                    raise UnsupportedEncoding(f"unsupported Transfer-Encoding {coding[:100]!r}")
                length = response.content_length
                partial = byte_range if 200 <= status < 300 else None
                if partial is not None:
                    framing = UNTIL_CLOSE if length is None else length
                    check_partial(status, response_headers, framing, partial)
                if max_bytes is not None and length is not None and length > max_bytes:
                    raise too_large(url, f"{length} bytes > max_object_bytes={max_bytes}")
                body = await response.read()
                if length is not None and len(body) < length:
                    raise IncompleteBody(
                        f"got {len(body)} of {length} bytes",
                        url=url,
                        stage="fetch",
                        cause=Reason.INCOMPLETE_BODY,
                    )
                if partial is not None and length is None:
                    check_partial_length(len(body), partial)
                return Response(status, response_headers, body)
        except FetchError:
            raise
        except FramingError as exc:
            raise framing_error(url, exc) from exc
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            if isinstance(exc, asyncio.TimeoutError):
                raise FetchTimeout(
                    "no data within the timeout", url=url, stage="fetch", cause=Reason.TIMED_OUT
                ) from exc
            raise error_for_exception(exc, url) from exc

    async def close(self) -> None:
        await self._session.close()
