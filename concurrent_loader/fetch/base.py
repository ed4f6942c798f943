"""The contract every fetcher implements, and the retry loop they share.

A :class:`Reader` turns a key (relative to the dataset's root) into the object's bytes. It
is created inside the event loop of the process that uses it and closed there. ``get``
either returns the whole object or raises a :class:`~concurrent_loader.errors.FetchError`
naming it: a retried object is fetched whole again, never stitched from a partial body.
"""

from __future__ import annotations

import asyncio
import random
import time
from abc import ABC, abstractmethod
from collections.abc import Callable

from ..config import FetchConfig
from ..errors import FetchError, Throttled
from .limit import AdaptiveLimit

__all__ = ["Reader"]


class Reader(ABC):
    """Reads whole objects, at most ``config.max_inflight_requests`` at a time."""

    def __init__(self, config: FetchConfig) -> None:
        self.config = config
        self.limit = AdaptiveLimit(
            config.max_inflight_requests, cooldown=config.retry.throttle_cooldown
        )
        self.retries = 0
        self._rng = random.Random()

    @abstractmethod
    def url_for(self, key: str) -> str:
        """The object's name for messages (``s3://bucket/key``): never holds credentials."""

    @abstractmethod
    async def _get_once(self, key: str, url: str) -> tuple[bytes | bytearray, float | None]:
        """One attempt: the whole body and its time to first byte (None when unknown), or a
        ``FetchError``."""

    def read_blocking(self, key: str) -> bytes | bytearray:
        """Read without an event loop; only readers of local files have it."""
        raise NotImplementedError(f"{type(self).__name__} reads only through get()")

    async def close(self) -> None:
        """Release connections. Idempotent."""

    async def get(
        self,
        key: str,
        *,
        on_response: Callable[[float, int, float | None], None] | None = None,
    ) -> bytes | bytearray:
        """The whole object, retrying transient failures per ``config.retry``.

        ``on_response(seconds, size, first_byte_s)`` is told the duration of the successful
        request alone (from its send to its last byte; not the time queued for a slot or
        backing off), and its time to first byte when the transport knows it.
        """
        url = self.url_for(key)
        retry = self.config.retry
        deadline = time.monotonic() + retry.max_total_seconds
        attempt = 0
        while True:
            await self.limit.acquire()
            throttled = False
            try:
                started = time.perf_counter()
                data, first_byte_s = await self._get_once(key, url)
                if on_response is not None:
                    on_response(time.perf_counter() - started, len(data), first_byte_s)
                return data
            except FetchError as exc:
                throttled = isinstance(exc, Throttled)
                attempt += 1
                delay = retry.backoff(attempt - 1, self._rng)
                if not exc.retryable or attempt >= retry.max_attempts:
                    if attempt > 1:
                        exc.add_note(f"gave up after {attempt} attempts")
                    raise
                if time.monotonic() + delay >= deadline:
                    exc.add_note(f"gave up after {retry.max_total_seconds:g} s of retries")
                    raise
            finally:
                self.limit.release(throttled=throttled)
            self.retries += 1
            await asyncio.sleep(delay)
