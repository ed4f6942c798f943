"""The plain HTTP(S) backend: ``GET {base}{key}`` for keys the caller lists (no listing).

A whole body is checked against the checksum the server sends, if any (:mod:`.checksum`),
piece by piece as the transport reads it, before it is returned; ``verify_checksums=False``
skips it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from functools import partial
from urllib.parse import quote, urlsplit

from ..config import FetchConfig
from ..errors import ConfigError
from ..transport import ConnectionPool, Origin, Proxy
from .base import Body, ByteRange, Capabilities, ObjectInfo
from .checksum import RunningChecksum, covers_whole_object, http_checksum
from .shared import error_for_status, ssl_context_for

__all__ = ["HttpConfig", "HttpStore"]

_CAPABILITIES = Capabilities(remote=True, listing=False, ranges=True)


@dataclass(frozen=True)
class HttpConfig:
    """``http(s)://host[:port]/base/``: ``base`` always ends with ``/``."""

    scheme: str
    netloc: str
    base: str
    #: a CA bundle to trust instead of the system's
    ca_bundle: str | None = None
    #: check bodies against the checksum headers the server sends
    verify_checksums: bool = True

    @property
    def capabilities(self) -> Capabilities:
        return _CAPABILITIES

    @classmethod
    def from_url(
        cls, url: str, *, ca_bundle: str | None = None, verify_checksums: bool = True
    ) -> HttpConfig:
        parts = urlsplit(url)
        if not parts.netloc:
            raise ConfigError(f"malformed URL {url!r}: no host")
        if parts.username or parts.password:
            raise ConfigError(
                "credentials in a URL are not supported: use the AWS credential chain"
            )
        base = parts.path or "/"
        if not base.endswith("/"):
            base += "/"
        return cls(parts.scheme.lower(), parts.netloc, base, ca_bundle, verify_checksums)

    def resolved(self) -> HttpConfig:
        return self

    def url_for(self, key: str) -> str:
        return f"{self.scheme}://{self.netloc}{self.base}{key}"

    def open(self, fetch: FetchConfig) -> HttpStore:
        return HttpStore(self, fetch)

    def __str__(self) -> str:
        return self.url_for("")


class HttpStore:
    """GETs ``{base}{key}`` (keys are percent-encoded; ``/`` kept). Open it inside a loop."""

    capabilities = _CAPABILITIES

    def __init__(self, config: HttpConfig, fetch: FetchConfig) -> None:
        self.config = config
        self._max_bytes = fetch.max_object_bytes
        self._origin = Origin.from_url(f"{config.scheme}://{config.netloc}")
        proxy = _environ_proxy(self._origin)
        self._transport = ConnectionPool(
            max_connections=fetch.max_connections,
            timeouts=fetch.timeouts,
            ssl_context=ssl_context_for(fetch, config.ca_bundle),
            proxy=Proxy.from_url(proxy) if proxy else None,
        )
        # The transport's digest_for, for a whole body and for a range.
        self._digest_for = (partial(self._running, False), partial(self._running, True))

    def url_for(self, key: str) -> str:
        return self.config.url_for(key)

    async def get(self, key: str, byte_range: ByteRange | None = None) -> Body:
        url = self.url_for(key)
        target = quote(self.config.base + key, safe="/-_.~!$&'()*+,;=:@%")
        verify = self.config.verify_checksums
        digest_for = self._digest_for[byte_range is not None] if verify else None
        response = await self._transport.get(
            self._origin,
            target,
            (),
            url=url,
            max_bytes=self._max_bytes,
            byte_range=(byte_range.start, byte_range.end) if byte_range else None,
            digest_for=digest_for,
        )
        if response.status not in (200, 206):
            raise error_for_status(response.status, url)
        body = Body(response.body, response.first_byte_s)
        if verify:
            digest = response.digest
            if isinstance(digest, RunningChecksum):
                digest.check(url)
            elif byte_range is not None and not covers_whole_object(response.headers):
                # A part: its checksum is the whole object's, checked once assembled.
                body.object_checksum = http_checksum(response.headers, whole=False)
        return body

    @staticmethod
    def _running(ranged: bool, status: int, headers: dict[str, str]) -> RunningChecksum | None:
        """The transport's ``digest_for``: a fresh check of each successful whole body, fed
        as it arrives (a part's checksum is the whole object's: checked once assembled)."""
        if status not in (200, 206) or (ranged and not covers_whole_object(headers)):
            return None
        checksum = http_checksum(headers, whole=True)
        return None if checksum is None else checksum.running()

    async def list(self) -> AsyncIterator[ObjectInfo]:
        raise ConfigError(
            f"{self.config} is plain HTTP(S), which cannot be listed: pass keys= or a manifest",
            url=self.url_for(""),
        )
        yield  # pragma: no cover - makes this an async generator

    async def close(self) -> None:
        await self._transport.close()


def _environ_proxy(origin: Origin) -> str | None:
    """The proxy of ``HTTP(S)_PROXY`` for ``origin``, unless ``NO_PROXY`` names it."""
    from urllib.request import getproxies, proxy_bypass

    if proxy_bypass(origin.host):
        return None
    return getproxies().get(origin.scheme)
