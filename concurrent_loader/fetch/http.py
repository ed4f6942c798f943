"""Reading objects over plain HTTP(S): ``{root}{key}`` for an explicit list of keys."""

from __future__ import annotations

from urllib.parse import quote

from ..config import FetchConfig
from ..location import Location
from ..transport import Origin, Transport, make_transport
from .base import Reader
from .s3 import ssl_context_for
from .translate import error_for_status

__all__ = ["HttpReader"]


class HttpReader(Reader):
    """GETs ``{root}{key}`` (keys are percent-encoded; ``/`` kept). Create it inside a loop."""

    def __init__(
        self, location: Location, *, config: FetchConfig | None = None, transport: str = "http1"
    ) -> None:
        config = config or FetchConfig()
        super().__init__(config)
        self.location = location
        self._origin = Origin.from_url(f"{location.scheme}://{location.netloc}")
        self._transport: Transport = make_transport(
            transport,
            max_connections=config.max_inflight_requests,
            timeouts=config.timeouts,
            ssl_context=ssl_context_for(config),
        )

    def url_for(self, key: str) -> str:
        return self.location.url_for(key)

    async def _get_once(self, key: str, url: str) -> tuple[bytes | bytearray, float | None]:
        target = quote(self.location.prefix + key, safe="/-_.~!$&'()*+,;=:@%")
        response = await self._transport.get(
            self._origin, target, [], url=url, max_bytes=self.config.max_object_bytes
        )
        # Both transports already refuse a body shorter than its Content-Length.
        if response.status != 200:
            raise error_for_status(response.status, response.body, url)
        return response.body, response.first_byte_s

    async def close(self) -> None:
        await self._transport.close()
