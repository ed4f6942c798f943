"""HTTP/1.1 as the proxy needs it: request and response heads, and body relays.

* :class:`Request` and :class:`Response` parse a head and keep its lines verbatim, except
  hop-by-hop headers (``Connection``, ``Keep-Alive``, ``Expect``...), which the proxy
  answers itself. Forwarded heads are otherwise unchanged, so SigV4 signatures computed
  for the proxy's address stay valid upstream.
* The relays copy a body with its framing (``Content-Length``, chunked, or until close),
  optionally cutting it after a number of bytes. A source that breaks mid-body raises
  :class:`BrokenBody`, told apart from a sink (the other peer) that went away.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Awaitable, Callable
from xml.sax.saxutils import escape as xml_escape

__all__ = [
    "CHUNK",
    "BrokenBody",
    "Request",
    "Response",
    "Sink",
    "discard_body",
    "error_body",
    "relay_request_body",
    "relay_response_body",
    "simple_response",
    "writer_sink",
]

# Big relay chunks keep the per-byte CPU cost low; the proxy shares a core with the server
# in benchmarks.
CHUNK = 256 * 1024
# Where relayed bytes go: the paced client writer, an upstream writer, or nowhere.
Sink = Callable[[bytes], Awaitable[None]]
_HOP_BY_HOP = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-connection",
        b"expect",
        b"te",
        b"trailer",
        b"upgrade",
    }
)


def _parse_head(head: bytes) -> tuple[bytes, list[tuple[bytes, bytes, bytes]]]:
    """The start line of a head, and ``(lowercased name, stripped value, line)`` per header.

    ValueError for a header line without a colon, so a garbled request gets a 400 and a
    garbled upstream response a 502.
    """
    lines = head[:-4].split(b"\r\n")
    headers = []
    for line in lines[1:]:
        name, sep, value = line.partition(b":")
        if not sep:
            raise ValueError(f"malformed header line {line[:200]!r}")
        headers.append((name.strip().lower(), value.strip(), line))
    return lines[0], headers


class Request:
    """A request head from a client; its body, if any, is still on the connection."""

    __slots__ = (
        "arrival",
        "chunked",
        "content_length",
        "expects_continue",
        "header_lines",
        "keep_alive",
        "method",
        "target",
    )

    def __init__(self, head: bytes, arrival: float) -> None:
        request_line, headers = _parse_head(head)
        parts = request_line.split(b" ")
        if len(parts) != 3 or not parts[2].startswith(b"HTTP/1."):
            raise ValueError(f"malformed request line {request_line[:200]!r}")
        self.method = parts[0].decode("ascii")
        self.target = parts[1].decode("ascii")
        self.arrival = arrival
        http10 = parts[2] == b"HTTP/1.0"
        self.header_lines: list[bytes] = []
        connection = b""
        self.expects_continue = False
        self.content_length = 0
        self.chunked = False
        for lname, value, line in headers:
            if lname == b"connection":
                connection = value.lower()
            elif lname == b"expect":
                self.expects_continue = value.lower() == b"100-continue"
            elif lname == b"content-length":
                self.content_length = int(value)
            elif lname == b"transfer-encoding":
                self.chunked = b"chunked" in value.lower()
            if lname not in _HOP_BY_HOP:
                self.header_lines.append(line)
        self.keep_alive = b"keep-alive" in connection if http10 else b"close" not in connection
        self.expects_continue = self.expects_continue and self.has_body

    @property
    def path(self) -> str:
        return self.target.split("?", 1)[0]

    @property
    def has_body(self) -> bool:
        return self.chunked or self.content_length > 0

    def drop_header(self, name: bytes) -> None:
        """Forward the request without its ``name`` (lower-case) header lines."""
        self.header_lines = [
            line for line in self.header_lines if line.partition(b":")[0].strip().lower() != name
        ]

    def upstream_head(self) -> bytes:
        return (
            b"\r\n".join(
                [f"{self.method} {self.target} HTTP/1.1".encode("ascii"), *self.header_lines]
            )
            + b"\r\n\r\n"
        )


class Response:
    """A response head from the upstream, and how its body is framed."""

    __slots__ = (
        "chunked",
        "close_delimited",
        "header_lines",
        "length",
        "status",
        "status_line",
        "upstream_closes",
    )

    def __init__(self, head: bytes, request_method: str) -> None:
        self.status_line, headers = _parse_head(head)
        parts = self.status_line.split(b" ", 2)
        if len(parts) < 2 or not parts[0].startswith(b"HTTP/1."):
            raise ValueError(f"malformed status line {self.status_line[:200]!r}")
        self.status = int(parts[1])
        self.header_lines: list[bytes] = []
        self.length: int | None = None
        self.chunked = False
        self.upstream_closes = parts[0] == b"HTTP/1.0"
        for lname, value, line in headers:
            if lname == b"content-length":
                self.length = int(value)
            elif lname == b"transfer-encoding":
                self.chunked = b"chunked" in value.lower()
            elif lname == b"connection":
                self.upstream_closes = self.upstream_closes or b"close" in value.lower()
            if lname not in _HOP_BY_HOP:
                self.header_lines.append(line)
        if request_method == "HEAD" or self.status in (204, 304) or 100 <= self.status < 200:
            self.length, self.chunked = 0, False
        if self.chunked:
            self.length = None
        # Without a length or chunking the body ends when the upstream closes.
        self.close_delimited = self.length is None and not self.chunked

    @property
    def upstream_reusable(self) -> bool:
        return not self.close_delimited and not self.upstream_closes

    def client_head(self, close: bool) -> bytes:
        lines = [self.status_line, *self.header_lines]
        if close:
            lines.append(b"Connection: close")
        return b"\r\n".join(lines) + b"\r\n\r\n"


def error_body(code: str, message: str, resource: str) -> bytes:
    """An S3-style XML error document."""
    request_id = hashlib.blake2b(f"{time.time_ns()}{resource}".encode(), digest_size=8)
    return (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        f"<Error><Code>{code}</Code><Message>{xml_escape(message)}</Message>"
        f"<Resource>{xml_escape(resource)}</Resource>"
        f"<RequestId>{request_id.hexdigest().upper()}</RequestId></Error>"
    ).encode()


def simple_response(
    status: int,
    reason: str,
    body: bytes,
    content_type: str,
    close: bool,
    extra: tuple[str, ...] = (),
) -> bytes:
    """A whole response the proxy answers itself (errors, control endpoints); ``extra``:
    more header lines (``Name: value``)."""
    lines = [
        f"HTTP/1.1 {status} {reason}",
        f"Content-Type: {content_type}",
        f"Content-Length: {len(body)}",
        "Server: concurrent-loader-proxy",
        *extra,
    ]
    if close:
        lines.append("Connection: close")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


# -- body relays -------------------------------------------------------------------------


class BrokenBody(ConnectionError):
    """The sending side closed, reset or garbled the framing in the middle of a body."""


async def relay_request_body(request: Request, src: asyncio.StreamReader, sink: Sink) -> None:
    """Relay the request body, if any, from the client to ``sink``."""
    if request.chunked:
        await _relay_chunked(src, sink, None)
    else:
        await _relay_fixed(src, request.content_length, sink)


async def discard_body(request: Request, src: asyncio.StreamReader) -> None:
    """Read the request body and drop it, so the connection stays in sync."""
    await relay_request_body(request, src, _nowhere)


def writer_sink(writer: asyncio.StreamWriter) -> Sink:
    """A sink that writes to ``writer``, waiting for its buffer to drain."""

    async def sink(data: bytes) -> None:
        writer.write(data)
        await writer.drain()

    return sink


async def _nowhere(_: bytes) -> None:
    return None


async def relay_response_body(
    response: Response, src: asyncio.StreamReader, sink: Sink, cut_after: int | None
) -> bool:
    """Relay the response body; False when it was cut on purpose after ``cut_after``."""
    if response.chunked:
        return await _relay_chunked(src, sink, cut_after)
    if response.length is not None:
        if cut_after is None:
            await _relay_fixed(src, response.length, sink)
            return True
        await _relay_fixed(src, cut_after, sink)
        return cut_after >= response.length
    sent = 0
    while cut_after is None or sent < cut_after:
        data = await _read(src, CHUNK if cut_after is None else cut_after - sent)
        if not data:
            return True
        sent += len(data)
        await sink(data)
    return False


async def _read(src: asyncio.StreamReader, max_bytes: int) -> bytes:
    # Errors reading the source are told apart from errors writing to the sink, so a
    # broken upstream is not mistaken for a client that went away (and vice versa).
    try:
        return await src.read(max_bytes)
    except ConnectionError as exc:
        raise BrokenBody(f"connection lost: {exc!r}") from exc


async def _read_line(src: asyncio.StreamReader) -> bytes:
    try:
        return await src.readuntil(b"\r\n")
    except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError) as exc:
        raise BrokenBody(f"bad or missing chunk line: {exc!r}") from exc


async def _relay_fixed(src: asyncio.StreamReader, length: int, sink: Sink) -> None:
    remaining = length
    while remaining > 0:
        data = await _read(src, min(remaining, CHUNK))
        if not data:
            raise BrokenBody(f"connection closed with {remaining} of {length} bytes unread")
        remaining -= len(data)
        await sink(data)


async def _relay_chunked(src: asyncio.StreamReader, sink: Sink, cut_after: int | None) -> bool:
    """Relay one chunked body verbatim (framing included); False if cut after N bytes."""
    sent = 0
    while True:
        line = await _read_line(src)
        try:
            size = int(line.split(b";", 1)[0].strip(), 16)
        except ValueError as exc:
            raise BrokenBody(f"bad chunk size line {line[:100]!r}") from exc
        if size == 0:
            await sink(line)
            while True:  # trailers, up to the empty line
                trailer = await _read_line(src)
                await sink(trailer)
                if trailer == b"\r\n":
                    return True
        await sink(line)
        remaining = size + 2  # chunk data and its CRLF
        while remaining > 0:
            want = min(remaining, CHUNK)
            if cut_after is not None:
                want = min(want, max(1, cut_after - sent))
            data = await _read(src, want)
            if not data:
                raise BrokenBody("connection closed inside a chunk")
            remaining -= len(data)
            sent += len(data)
            await sink(data)
            if cut_after is not None and sent >= cut_after:
                return False
