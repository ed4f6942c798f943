"""HTTP clients for the GET of every object: HTTP only, nothing about any store.

A transport sends ``GET target`` to an :class:`Origin` with the caller's headers and
returns the :class:`Response` read to the end. Signing, addressing and what a status means
for a store belong to the reader that calls it (:mod:`concurrent_loader.fetch`). Every
transport guarantees:

* it writes the ``Host`` header itself, from :attr:`Origin.host_header` (the value a
  signer must sign); a caller's own ``Host`` header is refused with ``ConfigError``, as is
  a target or header value that could break the request's framing;
* at most ``max_connections`` connections open at once; callers beyond that wait, in FIFO
  order for ``"http1"``, woken when a connection is released, never by polling;
* a connection is reused only after its response was read to the end and the server did
  not ask to close it; any other connection is closed, and so is one that received bytes
  past the end of its response, in the same read or later while idle, up to the moment
  the next request is written (its socket is asked for unread bytes then), so they are
  never read as the next response. Bytes that reach a connection only after the next
  request was written cannot be told from its response by any HTTP/1.1 client (bytes that
  are not a response fail its framing);
* only the ``chunked`` transfer coding is accepted: ``gzip, chunked`` and the like are
  refused (``FetchError``, ``Reason.UNSUPPORTED_ENCODING``, not retried) rather than hand
  over encoded bytes as the object; no content coding is asked for (no
  ``Accept-Encoding``), and a body is never decoded;
* ``max_bytes`` bounds the body: checked against ``Content-Length`` before any body byte
  is read; ``"http1"`` also stops a body of unknown length as soon as it passes the bound;
* ``byte_range=(start, end)`` (``end`` exclusive) sends ``Range: bytes=start-(end-1)``, and
  a success is then exactly that range: ``206 Partial Content`` whose ``Content-Range``
  (when present) names the range and whose body is ``end - start`` bytes, else
  ``ConnectionFailed`` with ``Reason.MALFORMED_RESPONSE``. A ``200`` (the server ignored
  ``Range``) is refused with ``BadRequest`` (``Reason.BAD_REQUEST``, not retried) before
  its body is read, rather than download a whole object to slice a part of it; a range
  that reaches past the end of the object comes back shorter and is refused too.
  Non-2xx answers (``416``) are returned like any other status;
* transport failures raise the :mod:`concurrent_loader.errors` tree with
  ``stage="fetch"``, ``url=url`` and a :class:`~concurrent_loader.errors.Reason`:
  ``ConnectionFailed`` (refused, reset, closed early, TLS, malformed response),
  ``IncompleteBody`` (fewer bytes than ``Content-Length``), ``FetchTimeout`` (connect,
  first byte, or a read stall; ``"aiohttp"`` reports one ``TimedOut`` for the last two),
  ``ObjectTooLarge``. Non-2xx statuses are returned, not raised: the caller maps them
  and may need the body (S3's XML error). ``url`` labels errors only: it is never
  requested, and must not carry credentials;
* a cancelled ``get`` leaves no half-read connection to be reused (``"http1"`` closes it at
  once); ``close()`` closes every socket before it returns, and a ``get`` on a closed
  transport raises ``RuntimeError``.

Transports, by name (:func:`make_transport`):

- ``"http1"`` (default): :class:`ConnectionPool`, our HTTP/1.1 client on
  ``asyncio.BufferedProtocol``, which has the kernel write a ``Content-Length`` body
  straight into the one ``bytearray`` the caller receives; the cheapest per GET. It also
  retries once a request that failed before any response byte on a *reused* connection
  (one the server closed while it sat idle), and nothing else.
- ``"aiohttp"``: :class:`~.aiohttp.AiohttpTransport`, aiohttp's client, for environments
  that need its features.

Both work on the default asyncio loop and on uvloop, over plain TCP and TLS, directly or
through an ``http://`` forward proxy (:mod:`.proxy`).
"""

from __future__ import annotations

import ssl
from collections.abc import Sequence
from typing import Protocol

from concurrent_loader.config import Timeouts
from concurrent_loader.errors import ConfigError, Reason

from .origin import Origin
from .pool import ConnectionPool
from .proxy import Proxy
from .response import Response

__all__ = [
    "TRANSPORTS",
    "ConnectionPool",
    "Origin",
    "Proxy",
    "Response",
    "Transport",
    "make_transport",
]

#: the names :func:`make_transport` knows, the default first
TRANSPORTS = ("http1", "aiohttp")


class Transport(Protocol):
    """A pooled, bounded HTTP client for GETs (see the module docstring for its contract)."""

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
        """GET ``target`` (already URI-encoded, starting with ``/``) from ``origin``."""
        ...

    async def close(self) -> None:
        """Close every connection. Idempotent."""
        ...


def make_transport(
    name: str,
    *,
    max_connections: int,
    timeouts: Timeouts,
    ssl_context: ssl.SSLContext | None,
    proxy: str | None = None,
) -> Transport:
    """The transport called ``name`` (one of :data:`TRANSPORTS`).

    ``ssl_context`` ``None`` verifies certificates against the system's trust store.
    ``proxy`` (an ``http://`` URL, possibly with a user and password) is the forward proxy
    every request goes through (see :mod:`.proxy`); the caller decides which origins
    bypass it (``NO_PROXY``).
    """
    forward = Proxy.from_url(proxy) if proxy else None
    if name == "http1":
        return ConnectionPool(
            max_connections=max_connections,
            timeouts=timeouts,
            ssl_context=ssl_context,
            proxy=forward,
        )
    if name == "aiohttp":
        # Imported only when asked for: aiohttp takes a noticeable time to import.
        from .aiohttp import AiohttpTransport

        return AiohttpTransport(
            max_connections=max_connections,
            timeouts=timeouts,
            ssl_context=ssl_context,
            proxy=forward,
        )
    raise ConfigError(
        f"unknown transport {name!r}: expected one of {', '.join(map(repr, TRANSPORTS))}",
        cause=Reason.INVALID_ARGUMENT,
    )
