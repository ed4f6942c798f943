"""Read-ahead: small ranges of large objects read as larger aligned spans kept in memory.

A reader that walks a large object (a tar shard streamed in shard order, see
:class:`~concurrent_loader.ShardOrderSampler`) asks for many small ranges close together,
each of them a GET of its own. :class:`ReadaheadStore`, a store around a store, answers a
range from the span it falls in (the aligned block of :attr:`Readahead.span_bytes` bytes,
cut at the object's end), which it GETs once and keeps, so the next ranges of that span
cost no request. Guarantees:

- a range's bytes are exactly those a ranged GET of it returns (one that crosses a span
  boundary is put together from both spans);
- one GET per span at a time: ranges of a span asked for while its GET is in flight wait
  for that GET, and a reader cancelled meanwhile (a hedge that lost) does not cancel it;
- bounded: at most :attr:`Readahead.max_bytes` of spans are kept, the least recently read
  dropped first, and at most as many again are being fetched; a range whose span would
  exceed that, a range longer than a span, a whole-object read, and a range of an object
  whose size is not known go to the wrapped store as they are;
- a span whose GET failed is not kept: the error reaches every reader waiting for it, and
  the next read of that span (the fetch client's retry) GETs it again;
- a range served from a kept span is marked ``from_cache`` (it took no request: no latency
  sample for the in-flight limit or the hedge delay).

It suits sequential reading only: read in random order, a span is fetched for one small
range and dropped before the next range of it comes, so the bytes fetched grow by up to
``span_bytes`` per range. The memory it holds (spans kept and in flight) is outside the
loader's byte budget (``max_inflight_bytes``), per process.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections import OrderedDict
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from functools import partial

from ..config import FetchConfig
from ..errors import ConfigError, Reason
from .base import Body, ByteRange, Capabilities, ObjectInfo, Store, StoreConfig

__all__ = ["Readahead", "ReadaheadConfig", "ReadaheadStore"]

_MiB = 1024 * 1024


@dataclass(frozen=True)
class Readahead:
    """Read ranges as aligned spans of ``span_bytes``, keeping at most ``max_bytes`` of them
    per process (and fetching at most as many bytes of spans at once)."""

    span_bytes: int = 8 * _MiB
    max_bytes: int = 64 * _MiB

    def __post_init__(self) -> None:
        for name in ("span_bytes", "max_bytes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(
                    f"Readahead.{name} must be an int >= 1, got {value!r}",
                    cause=Reason.INVALID_ARGUMENT,
                )
        if self.max_bytes < self.span_bytes:
            raise ConfigError(
                f"Readahead.max_bytes ({self.max_bytes}) must hold at least one span "
                f"(span_bytes={self.span_bytes})",
                cause=Reason.INVALID_ARGUMENT,
            )


@dataclass(frozen=True, eq=False)
class ReadaheadConfig:
    """``inner`` read through spans (:class:`Readahead`); ``sizes`` are the objects' sizes
    (an object not in it is read as it is). Compared and hashed by identity: each process
    keeps one fetch client per config object."""

    inner: StoreConfig
    sizes: Mapping[str, int]
    readahead: Readahead = Readahead()

    @property
    def capabilities(self) -> Capabilities:
        return self.inner.capabilities

    def url_for(self, key: str) -> str:
        return self.inner.url_for(key)

    def resolved(self) -> ReadaheadConfig:
        return dataclasses.replace(self, inner=self.inner.resolved())

    def open(self, fetch: FetchConfig) -> ReadaheadStore:
        return ReadaheadStore(self, fetch)

    def __str__(self) -> str:
        return str(self.inner)


class ReadaheadStore:
    """Reads through spans; see the module docstring. Open and use it on one loop."""

    def __init__(self, config: ReadaheadConfig, fetch: FetchConfig) -> None:
        self.config = config
        self.inner: Store = config.inner.open(fetch)
        self.capabilities = self.inner.capabilities
        self._span = config.readahead.span_bytes
        self._max_bytes = config.readahead.max_bytes
        #: spans kept, least recently read first: (key, span number) -> bytes
        self._kept: OrderedDict[tuple[str, int], bytes | bytearray] = OrderedDict()
        self._kept_bytes = 0
        self._fetching: dict[tuple[str, int], asyncio.Task[Body]] = {}
        self._fetching_bytes = 0

    def url_for(self, key: str) -> str:
        return self.inner.url_for(key)

    def __repr__(self) -> str:
        return f"ReadaheadStore({self.config.inner}, {self.config.readahead})"

    async def get(self, key: str, byte_range: ByteRange | None = None) -> Body:
        size = self.config.sizes.get(key)
        if (
            byte_range is None
            or size is None
            or byte_range.end > size  # the store says what is wrong with it
            or byte_range.length > self._span
        ):
            return await self.inner.get(key, byte_range)
        first, last = byte_range.start // self._span, (byte_range.end - 1) // self._span
        if not all(self._can_have(key, n) for n in range(first, last + 1)):
            return await self.inner.get(key, byte_range)
        pieces: list[bytes] = []
        requested = False
        for n in range(first, last + 1):
            data, fetched = await self._span_of(key, n, size)
            requested |= fetched
            offset = n * self._span
            start, end = max(byte_range.start - offset, 0), min(byte_range.end - offset, len(data))
            with memoryview(data) as view:
                pieces.append(bytes(view[start:end]))
        body = pieces[0] if len(pieces) == 1 else b"".join(pieces)
        return Body(body, None, None, from_cache=not requested)

    def _can_have(self, key: str, n: int) -> bool:
        """Whether span ``n`` is kept, being fetched, or may be fetched now."""
        span_id = (key, n)
        return (
            span_id in self._kept
            or span_id in self._fetching
            or self._fetching_bytes + self._span <= self._max_bytes
        )

    async def _span_of(self, key: str, n: int, size: int) -> tuple[bytes | bytearray, bool]:
        """Span ``n`` of ``key`` and whether this read waited for its GET."""
        span_id = (key, n)
        kept = self._kept.get(span_id)
        if kept is not None:
            self._kept.move_to_end(span_id)
            return kept, False
        task = self._fetching.get(span_id)
        if task is None:
            span = ByteRange(n * self._span, min((n + 1) * self._span, size))
            task = asyncio.get_running_loop().create_task(self.inner.get(key, span))
            self._fetching[span_id] = task
            self._fetching_bytes += span.length
            task.add_done_callback(partial(self._landed, span_id, span.length))
        body = await asyncio.shield(task)  # a cancelled reader leaves the GET to the others
        return body.data, True

    def _landed(self, span_id: tuple[str, int], length: int, task: asyncio.Task[Body]) -> None:
        del self._fetching[span_id]
        self._fetching_bytes -= length
        if task.cancelled() or task.exception() is not None:
            return  # its readers got the error; the next read of the span GETs it again
        data = task.result().data
        self._kept[span_id] = data
        self._kept_bytes += len(data)
        while self._kept_bytes > self._max_bytes:
            _, dropped = self._kept.popitem(last=False)
            self._kept_bytes -= len(dropped)

    def list(self) -> AsyncIterator[ObjectInfo]:
        return self.inner.list()

    async def close(self) -> None:
        """Cancel the spans in flight, drop those kept, close the wrapped store."""
        tasks = list(self._fetching.values())
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks)
        self._kept.clear()
        self._kept_bytes = 0
        await self.inner.close()
