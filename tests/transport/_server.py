"""A scriptable HTTP/1.1 server and the helpers the transport tests share (fixtures are
in conftest.py).

The server is written for these tests: it speaks just enough HTTP/1.1 to produce every
framing (Content-Length, chunked, until-close, partial content) and every failure a
transport must turn into a typed error, and it counts connections and concurrent requests
on its side.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import os
import random
import socket
import ssl
import struct
from collections.abc import Callable
from typing import Any

from concurrent_loader.transport import Origin

#: a well-formed response no request asked for: a client that read it as the answer to its
#: next request would hand over these three bytes as the object
FAKE_RESPONSE = b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nBAD"


def payload(n: int) -> bytes:
    return random.Random(n).randbytes(n)


def open_sockets() -> set[str]:
    """Sockets open in this process (the event loop's own pipes and files do not count).

    Compared as sets, not counts: a socket an earlier test left to the garbage collector may
    close while this one runs, and must not hide one this test leaks."""
    found = set()
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # the listing's own fd is gone already
            target = os.readlink(f"/proc/self/fd/{fd}")
            if target.startswith("socket:"):
                found.add(target)
    return found


class Server:
    """A scriptable HTTP/1.1 server. The request path picks the behaviour:

    ``/len/N``           N bytes with Content-Length, keep-alive
    ``/chunked/N``       N bytes chunked (uneven chunk sizes, an extension, a trailer)
    ``/until-close/N``   N bytes, no length, then close
    ``/conn-close/N``    N bytes with Content-Length and ``Connection: close``
    ``/status/S``        status S with a small XML body (204 and 304 without one)
    ``/continue/N``      ``100 Continue``, then ``/len/N``
    ``/slow/N``          ``/len/N`` after 20 ms (counts concurrent requests)
    ``/first-byte/S``    ``/len/10`` after S seconds
    ``/stall/N``         headers and half the body, then silence
    ``/trickle/N``       Content-Length N, sent in 8 pieces 80 ms apart
    ``/truncate/N``      Content-Length N, half the body, then a clean close
    ``/reset/N``         Content-Length N, half the body, then a TCP reset
    ``/fail-reused/N``   ``/len/N`` on a connection's first request; close without a
                         response on any later one
    ``/silent-close``    close without a response
    ``/half-head``       part of the status line on a reused connection, then close
    ``/idle-close/N``    ``/len/N``, then close the connection 20 ms later
    ``/garbage``         a response that is not HTTP
    ``/trailing/N``      ``/len/N`` and a second, unasked-for response, in one write
    ``/stray-after/P``   the response of path ``P``, then 20 ms later an unasked-for one
    ``/te-gzip/N``       N bytes gzipped, ``Transfer-Encoding: gzip, chunked``
    ``/range/N``         an N-byte object that honours ``Range``: 206 with Content-Range
    ``/range-chunked/N`` the same 206, its body chunked
    ``/range-ignored/N`` an N-byte object that ignores ``Range``: 200 with all of it
    ``/range-shifted/N`` 206 with the right length, but the range one byte further on
    ``/range-long/N``    206 with the right Content-Range, but one byte more body
    ``/range-bare/N``    206 without Content-Range, the right length
    ``/range-bare-chunked-long/N`` 206 chunked, no Content-Range, one byte more body
    ``/range-200/N``     the range as ``/range/N`` sends it, with status 200 (rclone's)
    ``/range-200-chunked/N`` the same, its body chunked

    ``requests`` lists ``(path, headers)`` as received; ``strays_sent`` counts the
    unasked-for responses written. ``wait_for_requests(n)`` and
    ``wait_until(condition)`` return once the server saw it happen, so a test never
    sleeps to let a request reach us or a connection close.
    """

    def __init__(self, ssl_context: ssl.SSLContext | None = None) -> None:
        self.ssl_context = ssl_context
        self.connections = 0
        self.absolute_targets: list[str] = []
        self.inflight = 0
        self.max_inflight = 0
        self.requests: list[tuple[str, dict[str, str]]] = []
        self.writers: set[asyncio.StreamWriter] = set()
        self.closed_connections = 0
        self.strays_sent = 0
        self.port = 0
        self.handlers: set[asyncio.Task[Any]] = set()
        self._changed = asyncio.Event()

    async def __aenter__(self) -> Server:
        self.server = await asyncio.start_server(self.handle, "127.0.0.1", 0, ssl=self.ssl_context)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self.server.close()
        for task in self.handlers:
            task.cancel()
        await asyncio.gather(*self.handlers, return_exceptions=True)
        await self.server.wait_closed()

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self.writers.add(writer)
        task = asyncio.current_task()
        assert task is not None
        self.handlers.add(task)
        served = 0
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                lines = head.decode("latin-1").split("\r\n")
                _, path, _ = lines[0].split(" ")
                if path.startswith("http://"):  # absolute form, as through a forward proxy
                    self.absolute_targets.append(path)
                    path = "/" + path.split("/", 3)[3]
                headers = {}
                for line in lines[1:]:
                    if line:
                        name, _, value = line.partition(":")
                        headers[name.strip().lower()] = value.strip()
                self.requests.append((path, headers))
                self._notify()
                keep_open = await self.respond(path, writer, served)
                served += 1
                if not keep_open:
                    return
        except (ConnectionError, ssl.SSLError):
            return
        finally:
            self.closed_connections += 1
            self._notify()
            self.writers.discard(writer)
            self.handlers.discard(task)
            writer.transport.abort()

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    async def wait_until(self, condition: Callable[[], bool]) -> None:
        """Return once ``condition()`` holds, checked whenever a request arrives or a
        connection closes."""
        while not condition():
            await self._changed.wait()

    async def wait_for_requests(self, count: int) -> None:
        await self.wait_until(lambda: len(self.requests) >= count)

    async def wait_for_strays(self, count: int) -> None:
        await self.wait_until(lambda: self.strays_sent >= count)

    async def respond(self, path: str, writer: asyncio.StreamWriter, served: int) -> bool:
        route, _, arg = path[1:].partition("/")
        if route.startswith("range"):
            return await self.send_range(route, int(arg), self.requests[-1][1], writer)
        if route == "len":
            return await self.send_length(writer, int(arg))
        if route == "trailing":
            # A whole response, then what looks like another one nobody asked for.
            writer.write(length_response(int(arg)) + FAKE_RESPONSE)
            await writer.drain()
            self.strays_sent += 1
            self._notify()
            return True
        if route == "stray-after":
            # The response of the path that follows, then, 20 ms later (the connection idle
            # by then), what looks like another response nobody asked for.
            keep_open = await self.respond("/" + arg, writer, served)
            await asyncio.sleep(0.02)
            writer.write(FAKE_RESPONSE)
            await writer.drain()
            self.strays_sent += 1
            self._notify()
            return keep_open
        if route == "te-gzip":
            data = gzip.compress(payload(int(arg)))
            writer.write(
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n"
                b"%x\r\n%s\r\n0\r\n\r\n" % (len(data), data)
            )
            await writer.drain()
            return True
        if route == "chunked":
            body = payload(int(arg))
            out = [b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"]
            step, pos = 1, 0
            while pos < len(body):
                chunk = body[pos : pos + step]
                out.append(b"%x;ext=1\r\n%s\r\n" % (len(chunk), chunk))
                pos += len(chunk)
                step = step * 3 + 7
            out.append(b"0\r\nX-Trailer: yes\r\n\r\n")
            data = b"".join(out)
            # Dribble the framing across many writes so the parser sees every split.
            for i in range(0, len(data), 4093):
                writer.write(data[i : i + 4093])
                await writer.drain()
            return True
        if route == "until-close":
            writer.write(b"HTTP/1.1 200 OK\r\n\r\n" + payload(int(arg)))
            await writer.drain()
            return False
        if route == "conn-close":
            body = payload(int(arg))
            writer.write(
                b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s"
                % (len(body), body)
            )
            await writer.drain()
            return False
        if route == "status":
            status = int(arg)
            if status in (204, 304):
                writer.write(b"HTTP/1.1 %d X\r\n\r\n" % status)
            else:
                body = b"<Error><Code>NoSuchKey</Code></Error>"
                writer.write(
                    b"HTTP/1.1 %d Nope\r\nContent-Length: %d\r\nX-Dup: a\r\nx-dup: b\r\n\r\n%s"
                    % (status, len(body), body)
                )
            return True
        if route == "continue":
            writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            await writer.drain()
            return await self.send_length(writer, int(arg))
        if route == "slow":
            self.inflight += 1
            self.max_inflight = max(self.max_inflight, self.inflight)
            try:
                await asyncio.sleep(0.02)
            finally:
                self.inflight -= 1
            return await self.send_length(writer, int(arg))
        if route == "first-byte":
            await asyncio.sleep(float(arg))
            return await self.send_length(writer, 10)
        if route == "trickle":
            n = int(arg)
            data = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % n + payload(n)
            step = len(data) // 8 + 1
            for i in range(0, len(data), step):
                writer.write(data[i : i + step])
                await writer.drain()
                await asyncio.sleep(0.08)
            return True
        if route in ("stall", "truncate", "reset"):
            n = int(arg)
            writer.write(
                b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % n + payload(n)[: n // 2]
            )
            await writer.drain()
            if route == "stall":
                await asyncio.sleep(30)
            elif route == "reset":
                sock = writer.get_extra_info("socket")
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            return False
        if route == "fail-reused":
            if served:
                return False
            return await self.send_length(writer, int(arg))
        if route == "silent-close":
            return False
        if route == "half-head":
            writer.write(b"HTTP/1.1 2")
            await writer.drain()
            return False
        if route == "idle-close":
            await self.send_length(writer, int(arg))
            await asyncio.sleep(0.02)
            return False
        if route == "garbage":
            writer.write(b"SSH-2.0-OpenSSH\r\n\r\n")
            return False
        raise AssertionError(f"unknown route {path}")

    async def send_range(
        self, route: str, n: int, headers: dict[str, str], writer: asyncio.StreamWriter
    ) -> bool:
        body = payload(n)
        asked = headers.get("range")
        if asked is None or route == "range-ignored":
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (n, body))
            return True
        first_text, _, last_text = asked.removeprefix("bytes=").partition("-")
        first, last = int(first_text), min(int(last_text), n - 1)  # clamped, as servers do
        if first >= n:
            writer.write(b"HTTP/1.1 416 Range Not Satisfiable\r\nContent-Length: 0\r\n\r\n")
            return True
        if route == "range-shifted":
            first, last = first + 1, last + 1
        part = body[first : last + 1]
        if route in ("range-long", "range-bare-chunked-long"):
            part += b"!"
        head = [b"HTTP/1.1 200 OK" if "200" in route else b"HTTP/1.1 206 Partial Content"]
        if "bare" not in route:
            head.append(b"Content-Range: bytes %d-%d/%d" % (first, last, n))
        if "chunked" in route:
            head.append(b"Transfer-Encoding: chunked")
            half = len(part) // 2
            chunks = [p for p in (part[:half], part[half:]) if p]
            data = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in chunks) + b"0\r\n\r\n"
        else:
            head.append(b"Content-Length: %d" % len(part))
            data = part
        writer.write(b"\r\n".join(head) + b"\r\n\r\n" + data)
        await writer.drain()
        return True

    async def send_length(self, writer: asyncio.StreamWriter, n: int) -> bool:
        writer.write(length_response(n))
        await writer.drain()
        return True


def length_response(n: int) -> bytes:
    """The keep-alive response of ``/len/N``: ``payload(n)`` with its Content-Length."""
    return b'HTTP/1.1 200 OK\r\nContent-Length: %d\r\nETag: "x"\r\n\r\n' % n + payload(n)


def origin_of(server: Server) -> Origin:
    return Origin("https" if server.ssl_context else "http", "127.0.0.1", server.port)


class Recorder:
    """A ``BodyDigest`` that keeps a copy of every piece it is fed, with the head it was
    made for."""

    def __init__(self, status: int, headers: dict[str, str]) -> None:
        self.status = status
        self.headers = headers
        self.pieces: list[bytes] = []

    def update(self, data: memoryview, /) -> None:
        self.pieces.append(bytes(data))

    @property
    def data(self) -> bytes:
        return b"".join(self.pieces)


class Recorders:
    """A ``digest_for`` that makes a fresh :class:`Recorder` for every response head."""

    def __init__(self) -> None:
        self.made: list[Recorder] = []

    def __call__(self, status: int, headers: dict[str, str]) -> Recorder:
        recorder = Recorder(status, headers)
        self.made.append(recorder)
        return recorder
