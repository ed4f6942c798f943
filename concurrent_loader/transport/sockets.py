"""What the transports ask of a socket: a connection opened address by address, and
whether bytes wait in a connection that no request asked for.

* :func:`connect_socket` resolves with ``loop.getaddrinfo`` and connects to each address in
  turn, awaiting every future it starts: a caller cancelled mid-way (a connect timeout, a
  deadline, a hedge that lost) leaves no future behind whose exception nobody retrieves.
  uvloop's ``create_connection(host, port)`` does leave one: it waits for its own lookup
  with ``asyncio.wait``, so a ``gaierror`` after the caller left is reported at exit as
  "Future exception was never retrieved".
* :func:`has_unread_bytes` tells whether the kernel holds bytes of a socket that the event
  loop has not read yet. A connection about to be reused must have none: HTTP/1.1 has no
  request ids, so any byte that is there before the next request is written would be read
  as the start of that request's response.
"""

from __future__ import annotations

import asyncio
import fcntl
import socket
import termios

__all__ = ["connect_socket", "has_unread_bytes", "socket_fd"]

_NONE_UNREAD = bytes(4)  # FIONREAD's answer (a C int) when the receive queue is empty


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
        sock = socket.socket(family, kind, proto)
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


def has_unread_bytes(fd: int) -> bool:
    """Whether the receive queue of the socket ``fd`` holds bytes the loop has not read.

    ``fd`` must be open (its transport not closed). A socket that cannot be asked counts as
    holding some, so that its connection is not reused.
    """
    if fd < 0:
        return True
    try:
        return fcntl.ioctl(fd, termios.FIONREAD, _NONE_UNREAD) != _NONE_UNREAD
    except OSError:
        return True
