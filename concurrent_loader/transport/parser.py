"""HTTP/1.1 response framing as pure logic (no sockets, no loop): the head parser, the chunked
decoder and the checks of a ranged response. Every failure is a :class:`FramingError`
carrying only the detail, mapped by :func:`.errors.framing_error`.
"""

from __future__ import annotations

__all__ = ["ChunkedDecoder", "FramingError", "check_partial", "parse_head"]

MAX_HEAD_BYTES = 256 * 1024
MAX_CHUNK_LINE = 4096

# The body framing parse_head reports, besides a Content-Length (>= 0).
CHUNKED = -1  # Transfer-Encoding: chunked
UNTIL_CLOSE = -2  # no length: the body ends when the connection does
INTERIM = -3  # a 1xx interim response (100 Continue, 103 Early Hints); the real one follows

#: ``(status, headers, keep_alive, framing, body_start)``: ``framing`` is a Content-Length
#: or one of the constants above; ``body_start`` is the offset of the first body byte.
Head = tuple[int, dict[str, str], bool, int, int]


class FramingError(Exception):
    """A response this module cannot accept; the message is the detail."""


class ProtocolError(FramingError):
    """Not a well-framed HTTP/1.1 response, or a partial answer that is not the range asked
    for."""


class UnsupportedEncoding(FramingError):
    """A transfer coding other than ``chunked``: the bytes are not the object's."""


class BodyTooLarge(FramingError):
    """A body whose length was not announced grew past its limit."""


class RangeIgnored(FramingError):
    """A ranged request answered with a success that does not show it is the range."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def _is_number(text: str) -> bool:
    """Whether ``text`` is a decimal number in ASCII digits (``int`` also takes others)."""
    return text.isascii() and text.isdigit()


def parse_head(buffer: bytearray, search_from: int, end: int) -> Head | None:
    """The response head at the start of ``buffer[:end]``, or None while incomplete (the
    blank line ending it starts at ``search_from`` or later). Header names are lower-cased,
    repeated headers joined with ``", "``. Raises ``ProtocolError``."""
    stop = buffer.find(b"\r\n\r\n", search_from, end)
    if stop < 0:
        if end >= MAX_HEAD_BYTES:
            raise ProtocolError(f"response headers over {MAX_HEAD_BYTES} bytes")
        return None
    lines = buffer[:stop].decode("latin-1").split("\r\n")
    version, _, rest = lines[0].partition(" ")
    status_text = rest[:3]
    # ASCII digits only: isdigit() alone takes "²", a latin-1 digit that int() refuses.
    if (
        not version.startswith("HTTP/1.")
        or not (status_text.isascii() and status_text.isdigit())
        or rest[3:4] not in ("", " ")
    ):
        raise ProtocolError(f"bad status line {lines[0][:100]!r}")
    status = int(status_text)
    headers: dict[str, str] = {}
    del lines[0]
    for line in lines:
        name, sep, value = line.partition(":")
        if not sep:
            raise ProtocolError(f"bad header line {line[:100]!r}")
        name = name.strip().lower()
        if name in headers:
            headers[name] += ", " + value.strip()
        else:
            headers[name] = value.strip()
    body_start = stop + 4
    if 100 <= status < 200 and status != 101:
        return status, headers, True, INTERIM, body_start
    connection = headers.get("connection", "").lower()
    # HTTP/1.1 keeps a connection open unless told otherwise; HTTP/1.0 only when told to.
    keep_alive = (
        ("close" not in connection) if version == "HTTP/1.1" else ("keep-alive" in connection)
    )

    transfer_encoding = headers.get("transfer-encoding")
    framing: int
    if status in (204, 304):
        framing = 0
    elif transfer_encoding is not None and (codings := transfer_codings(transfer_encoding)):
        if codings != ["chunked"]:
            raise UnsupportedEncoding(
                f"unsupported Transfer-Encoding {transfer_encoding[:100]!r}: only chunked is "
                "accepted, since any other coding would hand over bytes that are not the object"
            )
        framing = CHUNKED
    elif "content-length" in headers:
        framing = parse_content_length(headers["content-length"])
    else:
        framing = UNTIL_CLOSE
        keep_alive = False
    return status, headers, keep_alive, framing, body_start


def transfer_codings(value: str) -> list[str]:
    """The codings a ``Transfer-Encoding`` value lists, lowercased, without ``identity``."""
    codings = (coding.strip().lower() for coding in value.split(","))
    return [coding for coding in codings if coding and coding != "identity"]


def parse_content_length(value: str) -> int:
    """The length a ``Content-Length`` value announces; raises ``ProtocolError``."""
    if value.isascii() and value.isdigit():
        return int(value)
    # Repeated identical Content-Length headers arrive joined as "n, n".
    values = {v.strip() for v in value.split(",")}
    text = values.pop() if len(values) == 1 else ""
    if not _is_number(text):
        raise ProtocolError(f"bad Content-Length {value[:100]!r}")
    return int(text)


# Chunked-decoder states.
_SIZE = 0
_DATA = 1
_DATA_END = 2
_TRAILER = 3


class ChunkedDecoder:
    """Decodes a ``chunked`` body fed in pieces of any size: ``feed`` appends to ``body`` and
    returns True after the last chunk and trailers (``overrun``: bytes followed). Raises
    ``ProtocolError``, or ``BodyTooLarge`` once a chunk would pass ``max_bytes``."""

    __slots__ = ("_left", "_raw", "_state", "body", "max_bytes", "overrun")

    def __init__(self, max_bytes: int | None = None) -> None:
        self.body = bytearray()
        self.max_bytes = max_bytes
        self.overrun = False
        self._raw = bytearray()
        self._state = _SIZE
        self._left = 0

    def feed(self, data: bytes | bytearray | memoryview) -> bool:
        raw = self._raw
        raw += data
        pos = 0
        size = len(raw)
        while pos < size:
            if self._state == _DATA:
                take = min(self._left, size - pos)
                self.body += raw[pos : pos + take]
                pos += take
                self._left -= take
                if self._left:
                    break
                self._state = _DATA_END
                continue
            eol = raw.find(b"\r\n", pos)
            if eol < 0:
                if size - pos > MAX_CHUNK_LINE:
                    raise ProtocolError("chunk header line too long")
                break
            line = raw[pos:eol]
            pos = eol + 2
            if self._state == _SIZE:
                size_text = line.split(b";", 1)[0].strip()
                try:
                    chunk_size = int(size_text, 16)
                except ValueError:
                    chunk_size = -1
                if chunk_size < 0:
                    raise ProtocolError(f"bad chunk size {bytes(line[:40])!r}")
                if chunk_size == 0:
                    self._state = _TRAILER
                    continue
                if self.max_bytes is not None and len(self.body) + chunk_size > self.max_bytes:
                    raise BodyTooLarge(f"body over max_bytes {self.max_bytes}")
                self._left = chunk_size
                self._state = _DATA
            elif self._state == _DATA_END:
                if line:
                    raise ProtocolError("chunk not followed by CRLF")
                self._state = _SIZE
            elif not line:  # the empty line that ends the trailers
                self.overrun = pos < size
                self._raw = bytearray()
                return True
        del raw[:pos]
        return False


def check_partial(
    status: int, headers: dict[str, str], framing: int, byte_range: tuple[int, int]
) -> None:
    """Check the head of a 2xx response to a request for ``byte_range`` (end exclusive).

    A ``206`` must match the range: its ``Content-Range`` (if any) and ``Content-Length``
    (else ``ProtocolError``). Another success (``200``, as ``rclone serve s3`` answers) is
    taken only when it shows it holds exactly the range: a ``Content-Range`` of exactly the
    range, or, without one, a range from byte 0 and a ``Content-Length`` of its size (the
    body is those bytes whether the server cut it or the object is that long). Any other
    ``200`` may be the whole object, far larger than the range: ``RangeIgnored``, refused
    before any body byte is read."""
    start, end = byte_range
    if headers.get("content-type", "").lower().startswith("multipart/"):
        raise ProtocolError(f"a multipart {status} to a single-range request")
    content_range = headers.get("content-range")
    if status != 206 and content_range is None and not (start == 0 and framing == end):
        size = f"{framing} bytes" if framing >= 0 else "a body of unknown length"
        raise RangeIgnored(
            status,
            f"asked for bytes {start}-{end - 1}, got {status} with {size} and no "
            "Content-Range: the server ignored the range (the body may be the whole object)",
        )
    if content_range is not None:
        _check_content_range(content_range, start, end)
    if framing >= 0:
        check_partial_length(framing, byte_range)


def _check_content_range(content_range: str, start: int, end: int) -> None:
    """Refuse (``ProtocolError``) a ``Content-Range`` that is not ``bytes start-(end-1)/n``."""
    unit, _, rest = content_range.strip().partition(" ")
    span, _, complete = rest.partition("/")
    first, _, last = span.partition("-")
    if (
        unit.lower() != "bytes"
        or not _is_number(first)
        or not _is_number(last)
        or not (complete == "*" or _is_number(complete))
        or (complete != "*" and int(last) >= int(complete))
    ):
        raise ProtocolError(f"bad Content-Range {content_range[:100]!r}")
    if int(first) != start or int(last) != end - 1:
        raise ProtocolError(
            f"asked for bytes {start}-{end - 1}, got Content-Range {content_range[:100]!r}"
        )


def check_partial_length(length: int, byte_range: tuple[int, int]) -> None:
    """Refuse (``ProtocolError``) a partial body whose length is not the range's size."""
    start, end = byte_range
    if length != end - start:
        raise ProtocolError(
            f"asked for {end - start} bytes ({start}-{end - 1}), the response has {length}"
        )
