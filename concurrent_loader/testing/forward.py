"""An HTTP forward proxy on loopback that records every request it is asked to forward.

:class:`ForwardProxy` is what ``HTTP_PROXY`` / ``HTTPS_PROXY`` point at in the tests:

* a request in absolute form (``GET http://host:port/path HTTP/1.1``) is sent on to its
  origin in origin form, with the client's headers (``Host`` and a signature included)
  less the ``Proxy-*`` ones, and the response is relayed as the origin framed it
  (``Content-Length``, chunked, or until close); the client's connection stays open for
  its next request, and so does the one to the origin;
* ``CONNECT host:port`` opens a tunnel and relays its bytes both ways unread;
* :attr:`~ForwardProxy.requests` lists the request line of every request and tunnel, in
  the order they came, so a test counts what went through the proxy.

It speaks just enough HTTP/1.1 for S3 GETs and listings; requests with a body are
forwarded only with a ``Content-Length``.
"""

from __future__ import annotations

import asyncio
from urllib.parse import urlsplit

from .background import BackgroundServer, pipe

__all__ = ["ForwardProxy"]

_DROPPED = ("proxy-authorization", "proxy-connection")


def _parse_head(head: bytes) -> tuple[str, dict[str, str], list[str]]:
    """The first line, the headers by lower-case name, and the header lines as sent."""
    lines = head.decode("latin-1").split("\r\n")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if line:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
    return lines[0], headers, [line for line in lines[1:] if line]


class ForwardProxy(BackgroundServer):
    """``http://127.0.0.1:port``: forwards absolute-form requests and tunnels CONNECTs."""

    def __init__(self) -> None:
        super().__init__()
        self.requests: list[str] = []

    @property
    def url(self) -> str:
        return f"http://{self.address}"

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        origins: dict[tuple[str, int], tuple[asyncio.StreamReader, asyncio.StreamWriter]] = {}
        while True:
            try:
                head = await reader.readuntil(b"\r\n\r\n")
            except asyncio.IncompleteReadError:
                return  # the client closed between requests
            request_line, headers, lines = _parse_head(head)
            self.requests.append(request_line)
            method, target, version = request_line.split(" ", 2)
            if method == "CONNECT":
                host, _, port = target.rpartition(":")
                up_reader, up_writer = await asyncio.open_connection(host.strip("[]"), int(port))
                self.track(up_writer)
                writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
                await writer.drain()
                await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
                return
            url = urlsplit(target)
            if url.scheme != "http" or not url.hostname:
                writer.write(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
                return
            origin = (url.hostname, url.port or 80)
            if origin not in origins:
                origins[origin] = await asyncio.open_connection(*origin)
                self.track(origins[origin][1])
            up_reader, up_writer = origins[origin]
            path = (url.path or "/") + (f"?{url.query}" if url.query else "")
            kept = [line for line in lines if line.split(":", 1)[0].strip().lower() not in _DROPPED]
            body = b""
            if "content-length" in headers:
                body = await reader.readexactly(int(headers["content-length"]))
            up_writer.write(
                "\r\n".join([f"{method} {path} {version}", *kept, "", ""]).encode("latin-1") + body
            )
            await up_writer.drain()
            keep_alive = await self._relay_response(method, up_reader, writer)
            if not keep_alive or headers.get("connection", "").lower() == "close":
                return

    async def _relay_response(
        self, method: str, upstream: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> bool:
        """Relay one response as the origin framed it; False when the connection ends."""
        head = await upstream.readuntil(b"\r\n\r\n")
        status_line, headers, _ = _parse_head(head)
        status = int(status_line.split(" ", 2)[1])
        writer.write(head)
        if method == "HEAD" or status in (204, 304) or 100 <= status < 200:
            pass
        elif "content-length" in headers:
            remaining = int(headers["content-length"])
            while remaining:
                data = await upstream.read(min(remaining, 65536))
                if not data:
                    raise asyncio.IncompleteReadError(b"", remaining)
                writer.write(data)
                remaining -= len(data)
                await writer.drain()
        elif "chunked" in headers.get("transfer-encoding", "").lower():
            while True:
                size_line = await upstream.readuntil(b"\r\n")
                writer.write(size_line)
                size = int(size_line.split(b";", 1)[0], 16)
                if size == 0:
                    while (trailer := await upstream.readuntil(b"\r\n")) != b"\r\n":
                        writer.write(trailer)
                    writer.write(b"\r\n")
                    break
                writer.write(await upstream.readexactly(size + 2))
        else:
            while data := await upstream.read(65536):
                writer.write(data)
                await writer.drain()
            return False
        await writer.drain()
        return headers.get("connection", "").lower() != "close"
