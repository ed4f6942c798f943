"""What the transports ask of a socket: :func:`connect_socket` awaits every future it starts
(a cancelled caller leaves no unretrieved exception, as uvloop's ``create_connection``
would), and :class:`SocketProbe` tells whether unread bytes wait in it before reuse.
"""

from __future__ import annotations

import asyncio
import select
import socket

__all__ = ["SocketProbe", "connect_socket", "socket_fd"]


async def connect_socket(host: str, port: int) -> socket.socket:
    """A non-blocking TCP socket connected to ``host:port``, its addresses tried in order."""
    loop = asyncio.get_running_loop()
    try:
        infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise socket.gaierror(exc.errno, f"cannot resolve {host}: {exc.strerror}") from exc
    error: OSError | None = None
    for family, kind, proto, _, address in infos:
        try:
            # A host without IPv6 refuses the socket itself: the next address may do.
            sock = socket.socket(family, kind, proto)
        except OSError as exc:
            error = exc
            continue
        try:
            sock.setblocking(False)
            if family in (socket.AF_INET, socket.AF_INET6):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            await loop.sock_connect(sock, address)
        except OSError as exc:
            sock.close()
            error = exc
            continue
        except BaseException:
            sock.close()
            raise
        return sock
    raise error or OSError(f"no address found for {host}:{port}")


def socket_fd(transport: asyncio.BaseTransport) -> int:
    """The file descriptor of ``transport``'s socket (through TLS), or -1 if it has none."""
    sock = transport.get_extra_info("socket")
    return -1 if sock is None else int(sock.fileno())


class SocketProbe:
    """Whether bytes or the socket's end wait unread: one zero-timeout ``poll``, about 1 µs."""

    __slots__ = ("_poll",)

    def __init__(self, fd: int) -> None:
        """``fd`` is the socket's descriptor, -1 for none (then something always waits)."""
        self._poll: select.poll | None = None
        if fd >= 0:
            self._poll = select.poll()
            self._poll.register(fd, select.POLLIN)

    def pending(self) -> bool:
        """Whether bytes or the socket's end wait unread. Ask only while the socket's
        transport is open: a closed descriptor's number may be another socket's by then."""
        return self._poll is None or bool(self._poll.poll(0))
