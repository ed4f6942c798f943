"""Reading objects over plain HTTP(S): ``{root}{key}`` for an explicit list of keys."""

from __future__ import annotations

from urllib.parse import quote, urlsplit

from ..config import FetchConfig
from ..location import Location
from .base import Reader
from .s3 import ssl_context_for
from .translate import error_for_status
from .transport import Transport, make_transport

__all__ = ["HttpReader"]


class HttpReader(Reader):
    """GETs ``{root}{key}`` (keys are percent-encoded; ``/`` kept). Create it inside a loop."""

    def __init__(
        self, location: Location, *, config: FetchConfig | None = None, transport: str = "http1"
    ) -> None:
        config = config or FetchConfig()
        super().__init__(config)
        self.location = location
        parts = urlsplit(f"//{location.netloc}")
        self._host = parts.hostname or location.netloc
        self._port = parts.port or (443 if location.scheme == "https" else 80)
        self._transport: Transport = make_transport(transport, config, ssl_context_for(config))

    def url_for(self, key: str) -> str:
        return self.location.url_for(key)

    async def _get_once(self, key: str, url: str) -> tuple[bytes | bytearray, float | None]:
        target = quote(self.location.prefix + key, safe="/-_.~!$&'()*+,;=:@%")
        response = await self._transport.get(
            self.location.scheme,
            self._host,
            self._port,
            target,
            [("host", self.location.netloc)],
            url=url,
            max_bytes=self.config.max_object_bytes,
        )
        # Both transports already refuse a body shorter than its Content-Length.
        if response.status != 200:
            raise error_for_status(response.status, response.body, url)
        return response.body, response.first_byte_s

    async def close(self) -> None:
        await self._transport.close()
