"""Where a request goes: scheme, host and port, and the one place the ``Host`` header is made,
so the header that is signed is the header that is sent, byte for byte.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from urllib.parse import urlsplit

from concurrent_loader.errors import ConfigError

__all__ = ["Origin"]

_DEFAULT_PORTS = {"http": 80, "https": 443}


@dataclass(frozen=True, slots=True)
class Origin:
    """An HTTP(S) origin, validated (``ConfigError``); ``host`` a name or IP literal (IPv6
    without brackets). ``tls`` and ``host_header`` are computed once, read on every GET."""

    scheme: str
    host: str
    port: int
    #: whether the connection is TLS (``https``)
    tls: bool = field(init=False, repr=False, compare=False)
    #: the ``Host`` header: IPv6 literals in brackets, the scheme's default port omitted
    host_header: str = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        default_port = _DEFAULT_PORTS.get(self.scheme)
        if default_port is None:
            raise ConfigError(f"unsupported scheme {self.scheme!r}: expected 'http' or 'https'")
        if not isinstance(self.host, str) or not self.host.strip("[]"):
            raise ConfigError(f"empty or invalid host {self.host!r}")
        port = self.port
        if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
            raise ConfigError(f"port must be an int in 1..65535, got {port!r}")
        host = self.host.strip("[]")
        if any(c in host for c in "/?#@ \t\r\n") or ("[" in host or "]" in host):
            raise ConfigError(f"invalid host {self.host!r}")
        if ":" not in host:
            try:
                host.encode("idna")
            except UnicodeError as exc:
                # The resolver would raise this bare UnicodeError on every GET instead.
                raise ConfigError(f"invalid host name {self.host!r}: {exc}") from exc
        name = f"[{host}]" if ":" in host else host
        object.__setattr__(self, "host", host)
        object.__setattr__(self, "tls", self.scheme == "https")
        object.__setattr__(self, "host_header", name if port == default_port else f"{name}:{port}")

    @classmethod
    def from_url(cls, url: str) -> Origin:
        """The origin of an ``http(s)://`` URL (path and query ignored); one with credentials
        is refused rather than stripped: they would never be sent."""
        if not isinstance(url, str):
            raise ConfigError(f"URL must be a str, got {type(url).__name__}")
        try:
            parts = urlsplit(url)
            port = parts.port  # raises ValueError for a non-numeric or out-of-range port
        except ValueError as exc:
            raise ConfigError(f"malformed URL {url!r}: {exc}") from exc
        if parts.scheme not in _DEFAULT_PORTS:
            raise ConfigError(f"malformed URL {url!r}: expected http:// or https://")
        if parts.username is not None or parts.password is not None:
            # Not echoed: the message would carry the credentials into logs.
            raise ConfigError("credentials in a URL are not supported: use the credential chain")
        if not parts.hostname:
            raise ConfigError(f"malformed URL {url!r}: no host")
        if port is None:
            port = _DEFAULT_PORTS[parts.scheme]
        try:
            return cls(parts.scheme, parts.hostname, port)
        except ConfigError as exc:
            raise ConfigError(f"malformed URL {url!r}: {exc.message}") from exc
