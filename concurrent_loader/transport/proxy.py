"""An ``http://`` forward proxy between the transport and every origin (``HTTP_PROXY``,
``HTTPS_PROXY``, botocore's ``proxies``). ``http://`` origins are asked in absolute form,
``https://`` ones through a ``CONNECT`` tunnel with TLS inside. Its credentials go as
``Proxy-Authorization: Basic`` and appear in no repr, log or error. A refused tunnel is
``ConnectionFailed`` (retried), or ``AccessDenied`` for ``407``, naming the status line.
"""

from __future__ import annotations

import asyncio
import base64
import socket
from dataclasses import dataclass, field
from urllib.parse import unquote, urlsplit

from concurrent_loader.errors import AccessDenied, ConfigError, ConnectionFailed, Reason

from .origin import Origin
from .sockets import connect_socket

__all__ = ["Proxy"]

_MAX_CONNECT_RESPONSE = 16 * 1024


@dataclass(frozen=True, slots=True)
class Proxy:
    """An ``http://`` forward proxy; ``authorization`` is the ``Proxy-Authorization`` value."""

    origin: Origin
    authorization: str | None = field(default=None, repr=False)

    @classmethod
    def from_url(cls, url: str) -> Proxy:
        """The proxy of ``http://[user:password@]host[:port]`` (no scheme: taken as http)."""
        if not isinstance(url, str) or not url.strip():
            raise ConfigError(f"invalid proxy URL {url!r}")
        text = url.strip()
        if "://" not in text:
            text = "http://" + text
        parts = urlsplit(text)
        if parts.scheme != "http":
            raise ConfigError(
                f"proxy scheme {parts.scheme!r} is not supported: use an http:// proxy "
                "(HTTPS origins are tunnelled through it with CONNECT)"
            )
        authorization = None
        if parts.username is not None:
            pair = f"{unquote(parts.username)}:{unquote(parts.password or '')}"
            authorization = "Basic " + base64.b64encode(pair.encode()).decode("ascii")
        try:
            port = parts.port or 80
        except ValueError as exc:
            raise ConfigError("invalid proxy port") from exc
        if not parts.hostname:
            raise ConfigError("proxy URL has no host")
        return cls(Origin("http", parts.hostname, port), authorization)

    def headers(self) -> list[tuple[str, str]]:
        """Headers every request sent to the proxy carries."""
        return [] if self.authorization is None else [("Proxy-Authorization", self.authorization)]

    def connect_request(self, origin: Origin) -> bytes:
        name = f"[{origin.host}]" if ":" in origin.host else origin.host
        authority = f"{name}:{origin.port}"
        lines = [f"CONNECT {authority} HTTP/1.1", f"Host: {authority}"]
        lines += [f"{name}: {value}" for name, value in self.headers()]
        return ("\r\n".join(lines) + "\r\n\r\n").encode("ascii")

    async def open_tunnel(self, origin: Origin, url: str) -> socket.socket:
        """A socket connected to ``origin`` through the proxy, ready for TLS."""
        loop = asyncio.get_running_loop()
        sock = await connect_socket(self.origin.host, self.origin.port)
        try:
            await loop.sock_sendall(sock, self.connect_request(origin))
            head = bytearray()
            while b"\r\n\r\n" not in head:
                # A proxy sends nothing after its head until the client speaks.
                data = await loop.sock_recv(sock, 4096)
                if not data:
                    raise ConnectionFailed(
                        f"proxy {self.origin.host_header} closed the connection during CONNECT",
                        url=url,
                        stage="fetch",
                        cause=Reason.CONNECTION_CLOSED,
                    )
                head += data
                if len(head) > _MAX_CONNECT_RESPONSE:
                    break
            status_line = bytes(head.split(b"\r\n", 1)[0]).decode("latin-1")
            parts = status_line.split(" ", 2)
            if len(parts) >= 2 and parts[1] == "407":
                raise AccessDenied(
                    f"proxy {self.origin.host_header} wants credentials: {status_line[:200]!r}",
                    url=url,
                    stage="fetch",
                    cause=Reason.PROXY_REFUSED,
                    status=407,
                )
            if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or parts[1] != "200":
                raise ConnectionFailed(
                    f"proxy {self.origin.host_header} refused CONNECT: {status_line[:200]!r}",
                    url=url,
                    stage="fetch",
                    cause=Reason.PROXY_REFUSED,
                )
            if not head.endswith(b"\r\n\r\n"):
                raise ConnectionFailed(
                    f"proxy {self.origin.host_header} sent bytes after its CONNECT response",
                    url=url,
                    stage="fetch",
                    cause=Reason.MALFORMED_RESPONSE,
                )
        except BaseException:
            sock.close()
            raise
        return sock
