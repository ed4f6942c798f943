"""An in-memory store with scripted latency and failures, for tests of the loader's own logic.

``script(key, attempt)`` (``attempt`` from 0 per key) decides each GET: None answers, a
number of seconds answers that much later, an exception is raised, :data:`STALL` never
answers. The open stores of one config share its :class:`MemoryStats`.
"""

from __future__ import annotations

import asyncio
import collections
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..config import FetchConfig
from ..errors import ObjectNotFound, ObjectTooLarge
from ..stores.base import Body, ByteRange, Capabilities, ObjectInfo
from ..stores.shared import fetch_error

__all__ = ["STALL", "MemoryConfig", "MemoryStats", "MemoryStore"]

STALL = object()

Script = Callable[[str, int], Any]


class MemoryStats:
    """What the store was asked: GETs per key, GETs in flight now and at most."""

    def __init__(self) -> None:
        self.gets: collections.Counter[str] = collections.Counter()
        self.in_flight = 0
        self.max_in_flight = 0

    @property
    def total(self) -> int:
        return sum(self.gets.values())


@dataclass(frozen=True, eq=False)
class MemoryConfig:
    """``objects`` served under ``memory://{name}/``, after ``latency_s`` plus the script's."""

    objects: Mapping[str, bytes]
    name: str = "test"
    latency_s: float = 0.0
    script: Script | None = None
    remote: bool = True
    stats: MemoryStats = field(default_factory=MemoryStats)

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(remote=self.remote, listing=True, ranges=True)

    def resolved(self) -> MemoryConfig:
        return self

    def url_for(self, key: str) -> str:
        return f"memory://{self.name}/{key}"

    def open(self, fetch: FetchConfig) -> MemoryStore:
        return MemoryStore(self, fetch)


class MemoryStore:
    def __init__(self, config: MemoryConfig, fetch: FetchConfig) -> None:
        self.config = config
        self.capabilities = config.capabilities
        self._max_bytes = fetch.max_object_bytes

    def url_for(self, key: str) -> str:
        return self.config.url_for(key)

    def _read(self, key: str, byte_range: ByteRange | None) -> bytes:
        url = self.url_for(key)
        try:
            data = self.config.objects[key]
        except KeyError:
            raise fetch_error(ObjectNotFound, "no such object", url) from None
        if byte_range is not None:
            data = data[byte_range.start : byte_range.end]
        if len(data) > self._max_bytes:
            message = f"{len(data)} bytes > max_object_bytes={self._max_bytes}"
            raise fetch_error(ObjectTooLarge, message, url)
        return bytes(data)

    def _delay(self, key: str) -> float | None:
        """The script's answer: raised if an error, None to stall, else seconds to wait."""
        stats = self.config.stats
        attempt = stats.gets[key]
        stats.gets[key] += 1
        action = self.config.script(key, attempt) if self.config.script else None
        if action is STALL:
            return None
        if isinstance(action, BaseException):
            raise action
        return self.config.latency_s + (action if isinstance(action, (int, float)) else 0)

    async def get(self, key: str, byte_range: ByteRange | None = None) -> Body:
        stats = self.config.stats
        stats.in_flight += 1
        stats.max_in_flight = max(stats.max_in_flight, stats.in_flight)
        try:
            delay = self._delay(key)
            if delay is None:
                await asyncio.Event().wait()
            elif delay:
                await asyncio.sleep(delay)
            return Body(self._read(key, byte_range), delay)
        finally:
            stats.in_flight -= 1

    def get_blocking(self, key: str, byte_range: ByteRange | None = None) -> bytes:
        delay = self._delay(key)
        if delay is None:
            threading.Event().wait()
        elif delay:
            time.sleep(delay)
        return self._read(key, byte_range)

    def list_blocking(self) -> Iterator[ObjectInfo]:
        for key, data in self.config.objects.items():
            yield ObjectInfo(key, len(data))

    async def list(self) -> AsyncIterator[ObjectInfo]:
        for info in self.list_blocking():
            yield info

    async def close(self) -> None:
        pass
