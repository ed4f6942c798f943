"""Connecting address by address (:func:`connect_socket`): every address of a name is tried
in the resolver's order, and no socket is left open whichever way it ends."""

from __future__ import annotations

import asyncio
import errno
import socket
from typing import Any

import pytest

from concurrent_loader.transport import sockets

from .conftest import Runner


def _listener() -> socket.socket:
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.bind(("127.0.0.1", 0))
    server.listen()
    return server


def test_an_address_family_the_host_lacks_is_skipped_for_the_next_address(
    run: Runner, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A kernel without IPv6 (booted with ipv6.disable=1) refuses to make an AF_INET6
    # socket, while the resolver still lists the name's IPv6 address first.
    server = _listener()
    port = server.getsockname()[1]
    real_socket = socket.socket

    def no_ipv6(family: int = -1, *args: Any) -> socket.socket:
        if family == socket.AF_INET6:
            raise OSError(errno.EAFNOSUPPORT, "Address family not supported by protocol")
        return real_socket(family, *args)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        resolve = loop.getaddrinfo  # uvloop's sock_connect resolves its address with it too

        async def both_families(host: str, port: int, **options: Any) -> list[Any]:
            if host != "dual-stack.test":
                return await resolve(host, port, **options)
            return [
                (socket.AF_INET6, socket.SOCK_STREAM, 6, "", ("::1", port, 0, 0)),
                (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", port)),
            ]

        monkeypatch.setattr(loop, "getaddrinfo", both_families)
        monkeypatch.setattr(sockets.socket, "socket", no_ipv6)
        sock = await sockets.connect_socket("dual-stack.test", port)
        try:
            assert sock.getpeername() == ("127.0.0.1", port)
        finally:
            sock.close()

    try:
        run(main)
    finally:
        server.close()


def test_a_connect_cancelled_midway_leaves_no_socket_open(run: Runner) -> None:
    # A listener whose accept queue is full drops the SYN, so the connect hangs until the
    # caller gives up (a connect timeout, a deadline, a hedge that lost).
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.bind(("127.0.0.1", 0))
    server.listen(0)
    port = server.getsockname()[1]
    queued: list[socket.socket] = []

    async def main() -> None:
        try:
            for _ in range(4):  # fills the queue: the last ones are left pending
                client = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                client.setblocking(False)
                client.connect_ex(("127.0.0.1", port))
                queued.append(client)
            with pytest.raises(TimeoutError):
                async with asyncio.timeout(0.2):
                    await sockets.connect_socket("127.0.0.1", port)
        finally:
            for client in queued:
                client.close()
            server.close()

    run(main)  # which checks that no socket is left open
