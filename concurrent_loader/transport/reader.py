"""The reading half of a connection's ``asyncio.BufferedProtocol``: a ``Content-Length``
body is read by the kernel straight into the one ``bytearray`` that becomes
:attr:`Response.body`. Framing is :mod:`.parser`'s; what an ending means for the socket is
:class:`.connection.Connection`'s. Bytes past the response mark the connection not to be
kept alive.

A request may carry a ``digest_for``: called with the final response's status and headers,
what it returns (a :class:`BodyDigest`, or None) is fed every body byte, in order, exactly
once, as soon as it is in the body buffer (still in the CPU's cache), and is handed back
as :attr:`Response.digest`. Each response gets its own.
"""

from __future__ import annotations

import asyncio
import ctypes
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from .errors import framing_error, too_large
from .parser import (
    CHUNKED,
    INTERIM,
    ChunkedDecoder,
    FramingError,
    check_partial,
    check_partial_length,
    parse_head,
)

__all__ = ["BodyDigest", "DigestFor", "Response", "ResponseReader"]


class BodyDigest(Protocol):
    """What reads a body as it arrives: ``update`` gets each piece, in order, once. It must
    not keep ``data`` (the buffer may grow after it returns); if it raises, the GET fails
    with that error."""

    def update(self, data: memoryview, /) -> None: ...


#: ``(status, headers) -> BodyDigest | None``, called once the final head is read
DigestFor = Callable[[int, dict[str, str]], BodyDigest | None]


@dataclass(slots=True)
class Response:
    """One HTTP response, read to the end. ``headers`` names are lower-case; repeated
    headers are joined with ``", "``. The caller owns ``body`` (the transport keeps no
    reference to it, so a ``bytearray`` body may be resized in place)."""

    status: int
    headers: dict[str, str]
    body: bytearray | bytes
    #: seconds from the request's send to the first byte of the response, when measured
    first_byte_s: float | None = None
    #: what the request's ``digest_for`` returned for this response, fed its whole body
    digest: BodyDigest | None = None


# Any S3 response head and the first slice of the body; the rest goes to its final buffer.
_HEAD_BUFFER_BYTES = 16 * 1024
_SCRATCH_BYTES = 64 * 1024

# Connection states.
IDLE = 0  # no request in flight (pooled, or being handed out)
HEAD = 1  # waiting for / reading the status line and headers
LENGTH = 2  # reading a Content-Length body into its final buffer
CHUNKED_BODY = 3  # reading a Transfer-Encoding: chunked body
UNTIL_CLOSE = 4  # reading a body delimited by the end of the connection
DEAD = 5  # closed or failed; never reused

NO_BODY = bytearray()
NO_VIEW = memoryview(NO_BODY)

# A bytearray of a given length, not zero-filled: the body is written over by the socket
# before anyone sees it, and zeroing 100 KB costs more than the rest of a GET's parsing.
_new_bytearray = ctypes.pythonapi.PyByteArray_FromStringAndSize
_new_bytearray.argtypes = (ctypes.c_void_p, ctypes.c_ssize_t)
_new_bytearray.restype = ctypes.py_object


class ResponseReader(asyncio.BufferedProtocol):
    """The state of the response in flight and the framing of its bytes."""

    __slots__ = (
        "body",
        "body_view",
        "byte_range",
        "decoder",
        "digest",
        "digest_for",
        "expected",
        "first_byte_at",
        "got",
        "head",
        "head_len",
        "head_view",
        "headers",
        "keep_alive",
        "last_data",
        "loop",
        "max_bytes",
        "scratch",
        "started",
        "state",
        "status",
        "url",
    )

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.state = IDLE
        self.url = ""
        self.max_bytes: int | None = None
        self.byte_range: tuple[int, int] | None = None
        self.digest_for: DigestFor | None = None
        self.digest: BodyDigest | None = None
        self.started = False
        self.last_data = 0.0
        self.first_byte_at = 0.0
        self.head = bytearray(_HEAD_BUFFER_BYTES)
        self.head_view = memoryview(self.head)
        self.head_len = 0
        self.status = 0
        self.headers: dict[str, str] = {}
        self.keep_alive = False
        self.body = NO_BODY
        self.body_view = NO_VIEW
        self.got = 0
        self.expected = 0
        # Chunked or until-close bodies only: made on first use.
        self.scratch = NO_VIEW
        self.decoder = ChunkedDecoder()

    # -- what the connection does with a response's end (Connection's) ----------------

    def _complete(self) -> None:
        raise NotImplementedError

    def fail(self, error: BaseException) -> None:
        raise NotImplementedError

    def discard(self) -> None:
        raise NotImplementedError

    # -- asyncio protocol callbacks -----------------------------------------------------

    def get_buffer(self, sizehint: int) -> memoryview:
        state = self.state
        if state == LENGTH:
            # The kernel writes the body straight into its final buffer.
            return self.body_view[self.got :]
        if state == HEAD:
            if self.head_len == len(self.head):
                bigger = bytearray(2 * len(self.head))
                bigger[: self.head_len] = self.head
                self.head = bigger
                self.head_view = memoryview(bigger)
            return self.head_view[self.head_len :]
        if not self.scratch:
            self.scratch = memoryview(bytearray(_SCRATCH_BYTES))
        return self.scratch

    def buffer_updated(self, nbytes: int) -> None:
        state = self.state
        self.last_data = self.loop.time()
        if state == LENGTH:
            got = self.got
            self.got = got + nbytes
            # Now, while the bytes the kernel just wrote are still in the CPU's cache.
            if self.digest is not None and not self._digest(self.body_view[got : got + nbytes]):
                return
            if self.got >= self.expected:
                self._complete()
            return
        if state == HEAD:
            if not self.started:
                self.first_byte_at = self.last_data
            self.started = True
            search_from = self.head_len - 3 if self.head_len > 3 else 0
            self.head_len += nbytes
            self._read_head(search_from)
            return
        if state == CHUNKED_BODY:
            self._feed_chunks(self.scratch[:nbytes])
        elif state == UNTIL_CLOSE:
            data = self.scratch[:nbytes]
            self.body += data
            if self._digest(data):
                self._check_body_limit()
        else:
            # Bytes nobody asked for (a response without a request): the framing is lost.
            self.discard()

    # -- framing ----------------------------------------------------------------------

    def _read_head(self, search_from: int) -> None:
        try:
            head = parse_head(self.head, search_from, self.head_len)
            while head is not None and head[3] == INTERIM:
                # An interim response (100 Continue, 103 Early Hints): the real one follows.
                leftover = bytes(self.head[head[4] : self.head_len])
                self.head[: len(leftover)] = leftover
                self.head_len = len(leftover)
                head = parse_head(self.head, 0, self.head_len)
            if head is None:
                return
            status, headers, keep_alive, framing, body_start = head
            if self.byte_range is not None and 200 <= status < 300:
                check_partial(status, headers, framing, self.byte_range)
        except FramingError as exc:
            self.fail(framing_error(self.url, exc))
            return
        self.status = status
        self.headers = headers
        self.keep_alive = keep_alive
        if self.digest_for is not None:
            try:
                self.digest = self.digest_for(status, headers)
            except Exception as exc:
                self.fail(exc)
                return
        extra = self.head_view[body_start : self.head_len]
        if framing >= 0:
            self._start_length_body(framing, extra)
        elif framing == CHUNKED:
            self.state = CHUNKED_BODY
            self.decoder = ChunkedDecoder(self.max_bytes)
            self._feed_chunks(extra)
        else:
            self.state = UNTIL_CLOSE
            self.body = bytearray(extra)
            if self._digest(extra):
                self._check_body_limit()

    def _digest(self, data: memoryview) -> bool:
        """Feed ``data`` (just added to the body) to the response's digest, if any; False
        once the digest failed the response."""
        digest = self.digest
        if digest is None or not data:
            return True
        try:
            digest.update(data)
        except Exception as exc:
            self.fail(exc)
            return False
        return True

    def _start_length_body(self, length: int, extra: memoryview) -> None:
        if self.max_bytes is not None and length > self.max_bytes:
            detail = f"Content-Length {length} > max_bytes {self.max_bytes}"
            self.fail(too_large(self.url, detail))
            return
        body: bytearray = _new_bytearray(None, length)
        have = min(len(extra), length)
        body[:have] = extra[:have]
        if len(extra) > length:
            # Bytes past the body: the next response's framing is unknown.
            self.keep_alive = False
        self.body = body
        view = memoryview(body)
        if have and not self._digest(view[:have]):
            return
        if have == length:
            self._complete()
            return
        self.body_view = view
        self.got = have
        self.expected = length
        self.state = LENGTH

    def _feed_chunks(self, data: memoryview) -> None:
        decoder = self.decoder
        before = len(decoder.body)
        try:
            done = decoder.feed(data)
        except FramingError as exc:
            self.fail(framing_error(self.url, exc))
            return
        # The chunk data just decoded; the view is gone before the body grows again.
        if self.digest is not None and not self._digest(memoryview(decoder.body)[before:]):
            return
        if done:
            if decoder.overrun:
                self.keep_alive = False
            self.body = decoder.body
            self.decoder = ChunkedDecoder()  # the caller owns the body now
            self._finish_unknown_length()

    def _check_body_limit(self) -> None:
        """Fail with ObjectTooLarge once an until-close body passes max_bytes."""
        if self.max_bytes is not None and len(self.body) > self.max_bytes:
            self.fail(too_large(self.url, f"body over max_bytes {self.max_bytes}"))

    def _finish_unknown_length(self) -> None:
        """Complete a chunked or until-close body, its length checked against the range."""
        if self.byte_range is not None and 200 <= self.status < 300:
            try:
                check_partial_length(len(self.body), self.byte_range)
            except FramingError as exc:
                self.fail(framing_error(self.url, exc))
                return
        self._complete()
