"""The ``"aiohttp"`` transport: aiohttp's client behind the transport contract.

It keeps the contract of :mod:`concurrent_loader.transport` except that bodies are read
into ``bytes`` (not written in place) and ``first_byte_s`` is ``None``. A pooled connection
that received bytes while idle is closed instead of reused (:class:`_CleanConnector`), as
``"http1"`` does; aiohttp alone would read them as the next response.
"""

from __future__ import annotations

import asyncio
import ssl
import weakref
from collections.abc import Sequence
from typing import TYPE_CHECKING

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
from .sockets import SocketProbe, socket_fd

if TYPE_CHECKING:  # aiohttp's own modules, for the connector's signature only
    from aiohttp.client_proto import ResponseHandler
    from aiohttp.connector import Connection
    from aiohttp.tracing import Trace

__all__ = ["AiohttpTransport"]


class _CleanConnector(aiohttp.TCPConnector):
    """aiohttp's connector, except that a pooled connection is handed out only if nothing
    arrived on it since its last response: else it is closed and the next one tried (a new
    connection is taken as it comes, so a server that speaks first cannot make it loop)."""

    def __init__(self, *, limit: int, ssl_context: ssl.SSLContext | None) -> None:
        super().__init__(limit=limit, ssl=ssl_context if ssl_context is not None else True)
        self._served: weakref.WeakSet[ResponseHandler] = weakref.WeakSet()

    async def connect(
        self, req: aiohttp.ClientRequest, traces: list[Trace], timeout: aiohttp.ClientTimeout
    ) -> Connection:
        while True:
            conn = await super().connect(req, traces, timeout)
            protocol = conn.protocol
            if protocol is None or protocol not in self._served or _clean(conn, protocol):
                if protocol is not None:
                    self._served.add(protocol)
                return conn
            conn.close()


def _clean(conn: Connection, protocol: ResponseHandler) -> bool:
    """Whether an idle aiohttp connection holds no byte past its last response: none parsed
    (``should_close``, the one attribute used that aiohttp does not document, covers a
    queued message, a parse error, a pending tail) and none left unread in its socket."""
    transport = conn.transport
    return (
        transport is not None
        and not protocol.should_close
        and not SocketProbe(socket_fd(transport)).pending()
    )


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
        connector = _CleanConnector(limit=max_connections, ssl_context=ssl_context)
        # Bodies are the object's bytes, never decoded, so no content coding is asked for
        # (aiohttp's default Accept-Encoding would have servers send gzip), as in "http1".
        self._session = aiohttp.ClientSession(
            connector=connector,
            timeout=self._timeout,
            auto_decompress=False,
            skip_auto_headers=("Accept-Encoding",),
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
