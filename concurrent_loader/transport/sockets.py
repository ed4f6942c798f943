"""What the transports ask of a socket: a connection opened address by address, and
whether bytes wait in a connection that no request asked for.

* :func:`connect_socket` resolves with ``loop.getaddrinfo`` and connects to each address in
  turn, awaiting every future it starts: a caller cancelled mid-way (a connect timeout, a
  deadline, a hedge that lost) leaves no future behind whose exception nobody retrieves.
  uvloop's ``create_connection(host, port)`` does leave one: it waits for its own lookup
  with ``asyncio.wait``, so a ``gaierror`` after the caller left is reported at exit as
  "Future exception was never retrieved".
* :class:`SocketProbe` tells whether the kernel holds bytes of a socket that the event loop
  has not read yet. A connection about to be reused must have none: HTTP/1.1 has no
  request ids, so any byte that is there before the next request is written would be read
  as the start of that request's response.
"""

from __future__ import annotations

import asyncio
import select
import socket

__all__ = ["SocketProbe", "connect_socket", "socket_fd"]


async def connect_socket(host: str, port: int) -> socket.socket:
    """A non-blocking TCP socket connected to ``host:port`` (its addresses tried in order).

    Raises the ``OSError`` of the lookup (``socket.gaierror``) or of the last address tried.
    """
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
    """Asks one connected socket, without reading from it, whether anything waits in it
    that the event loop has not read yet: bytes, or the socket's end (the peer closed it,
    or it failed). One ``poll`` with a zero timeout, about 1 µs: asking for the count of
    bytes queued (``FIONREAD``) takes the socket's lock and costs twice that.
    """

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
