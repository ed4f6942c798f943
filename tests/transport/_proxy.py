"""A forward HTTP proxy for the transport tests (see :class:`ForwardProxy`)."""

from __future__ import annotations

import asyncio
from typing import Any

from concurrent_loader.testing.background import pipe


class ForwardProxy:
    """A forward HTTP proxy for the tests: ``CONNECT host:port`` opens a tunnel; a request in
    absolute form opens a connection to its origin and pipes the bytes both ways (the test
    :class:`Server` accepts absolute-form targets, as RFC 9112 asks of every server).

    ``heads`` lists the first request line and the ``Proxy-Authorization`` header of each
    connection. With ``authorization`` set, a connection without exactly that header is
    answered ``407`` and closed.
    """

    def __init__(self, authorization: str | None = None) -> None:
        self.authorization = authorization
        self.heads: list[tuple[str, str | None]] = []
        self.tasks: set[asyncio.Task[Any]] = set()
        self.writers: set[asyncio.StreamWriter] = set()

    async def __aenter__(self) -> ForwardProxy:
        self.server = await asyncio.start_server(self.handle, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self.server.close()
        for writer in self.writers:
            writer.close()
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        await self.server.wait_closed()

    def url(self, userinfo: str = "") -> str:
        return f"http://{userinfo}127.0.0.1:{self.port}"

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self.tasks.add(task)
        self.writers.add(writer)
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            method, target, _ = lines[0].split(" ")
            headers = {}
            for line in lines[1:]:
                if line:
                    name, _, value = line.partition(":")
                    headers[name.strip().lower()] = value.strip()
            given = headers.get("proxy-authorization")
            self.heads.append((lines[0], given))
            if self.authorization is not None and given != self.authorization:
                writer.write(b"HTTP/1.1 407 Proxy Authentication Required\r\n")
                writer.write(b"Proxy-Authenticate: Basic\r\nContent-Length: 0\r\n\r\n")
                await writer.drain()
                return
            if method == "CONNECT":
                host, _, port = target.rpartition(":")
            else:
                host, _, port = target.split("/", 3)[2].rpartition(":")
            up_reader, up_writer = await asyncio.open_connection(host.strip("[]"), int(port))
            self.writers.add(up_writer)
            if method == "CONNECT":
                writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
            else:
                up_writer.write(head)
            await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()
            self.tasks.discard(task)
