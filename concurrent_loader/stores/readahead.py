"""Read-ahead: small ranges of large objects read as larger aligned spans kept in memory.

:class:`ReadaheadStore` (a store around a store) answers a range from its aligned span of
:attr:`Readahead.span_bytes`, GET once and kept. Guarantees:

- a range's bytes are exactly a ranged GET's (across a span boundary, from both spans);
- one GET per span at a time; a cancelled caller (a lost hedge) does not cancel it;
- spans kept and in flight hold at most :attr:`Readahead.max_bytes`. A span with declared
  ranges (``ranges``) keeps, once it arrives, only those ranges' bytes (counted whole where
  ranges overlap), each let go as it is read (the memory a shuffle buffer of those samples
  would take); a range inside one (a part) is served from it too. It goes once all were
  read, or as stale once ``max_bytes`` of other ranges were: its unread ranges, and repeats
  within ``max_bytes`` (a hedge), are then read as they are, never by fetching the span
  again. An undeclared span is kept whole, least recently read dropped first. A range whose
  span finds no room is read as it is; so is a range not declared in a declared span, or
  read again once let go (a new pass fetches the span again);
- whole-object reads, ranges longer than a span and objects of unknown size pass through;
- a failed span GET is not kept; a range served from a kept span has ``round_trip=False``.

Its memory is per process and outside ``max_inflight_bytes``.
"""

from __future__ import annotations

import asyncio
import bisect
import dataclasses
from collections import OrderedDict
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial

import numpy as np

from ..config import FetchConfig, check_count
from ..errors import ConfigError
from .base import Body, ByteRange, Capabilities, ObjectInfo, Store, StoreConfig

__all__ = ["Readahead", "ReadaheadConfig", "ReadaheadStore"]

_MiB = 1024 * 1024

#: ascending offsets (a list, or a numpy array: compact for a shard of many samples)
Offsets = Sequence[int] | np.ndarray


@dataclass(frozen=True)
class Readahead:
    """Ranges read as aligned spans of ``span_bytes``, at most ``max_bytes`` kept and in
    flight per process: about a shuffle buffer's samples' bytes plus two spans."""

    span_bytes: int = 8 * _MiB
    max_bytes: int = 128 * _MiB

    def __post_init__(self) -> None:
        check_count("Readahead.span_bytes", self.span_bytes)
        check_count("Readahead.max_bytes", self.max_bytes)
        if self.max_bytes < self.span_bytes:
            raise ConfigError(f"Readahead.max_bytes must hold at least one span, {self.span_bytes}")


@dataclass(frozen=True, eq=False)
class ReadaheadConfig:
    """``inner`` read through spans. ``sizes``: the objects' sizes (others are read as they
    are). ``ranges``: per object, the ascending (starts, ends) of the ranges to be read.
    Compared by identity: a process keeps one fetch client per config object."""

    inner: StoreConfig
    sizes: Mapping[str, int]
    readahead: Readahead = Readahead()
    ranges: Mapping[str, tuple[Offsets, Offsets]] = field(default_factory=dict)

    @property
    def capabilities(self) -> Capabilities:
        return self.inner.capabilities

    def url_for(self, key: str) -> str:
        return self.inner.url_for(key)

    def resolved(self) -> ReadaheadConfig:
        return dataclasses.replace(self, inner=self.inner.resolved())

    def open(self, fetch: FetchConfig) -> ReadaheadStore:
        return ReadaheadStore(self, self.inner.open(fetch))

    def __str__(self) -> str:
        return str(self.inner)


@dataclass(eq=False)
class _Stragglers:
    """A span dropped as stale: its declared ranges not read yet, and the clock when one of
    its ranges was last asked for."""

    unread: set[tuple[int, int]]
    touched: int


@dataclass(eq=False)
class _Span:
    """A kept span: its bytes (``data``, undeclared) or the unread declared ranges' bytes in it
    (``pieces``, by their (start, end) clipped to the span), and when it was last read
    (``ReadaheadStore._clock``)."""

    data: bytes | bytearray | None
    pieces: dict[tuple[int, int], bytes] | None
    size: int
    last_read: int


class ReadaheadStore:
    """Reads ``inner`` (``config.inner`` opened) through spans, on one loop."""

    def __init__(self, config: ReadaheadConfig, inner: Store) -> None:
        self.config = config
        self.inner = inner
        self.capabilities = self.inner.capabilities
        self._span = config.readahead.span_bytes
        self._max_bytes = config.readahead.max_bytes
        #: spans kept, least recently read first
        self._kept: OrderedDict[tuple[str, int], _Span] = OrderedDict()
        self._kept_bytes = 0
        self._fetching: dict[tuple[str, int], asyncio.Task[Body]] = {}
        self._fetching_bytes = 0
        #: bytes of the ranges asked for so far: the clock staleness is measured on
        self._clock = 0
        #: spans dropped as stale with declared ranges unread: those ranges, and the clock when
        #: one was last read; they (and repeats within ``max_bytes``, a hedge) are read as they
        #: are, so a span is not fetched again for its stragglers
        self._stragglers: dict[tuple[str, int], _Stragglers] = {}

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
        numbers = range(byte_range.start // self._span, (byte_range.end - 1) // self._span + 1)
        self._clock += byte_range.length
        if not all(self._room_for(key, n, size) for n in numbers):
            return await self.inner.get(key, byte_range)
        pieces: list[bytes] = []
        requested = False
        for n in numbers:
            piece, fetched = await self._piece(key, n, size, byte_range)
            if piece is None:  # not declared, or read before and let go
                return await self.inner.get(key, byte_range)
            pieces.append(piece)
            requested |= fetched
        for n in numbers:
            self._read_from(key, n, byte_range)
        body = pieces[0] if len(pieces) == 1 else b"".join(pieces)
        return Body(body, None, None, round_trip=requested)

    # ------------------------------------------------------------------ room

    def _room_for(self, key: str, n: int, size: int) -> bool:
        """Whether span ``n`` is kept, on its way, or fits now (stale spans dropped first)."""
        span_id = (key, n)
        if span_id in self._kept or span_id in self._fetching:
            return True
        need = self._need(key, n, size)
        if self._kept_bytes + self._fetching_bytes + need <= self._max_bytes:
            return True
        stale = self._clock - self._max_bytes
        for candidate, span in [
            (s, span) for s, span in self._kept.items() if span.last_read < stale
        ]:
            if span.pieces:
                self._stragglers[candidate] = _Stragglers(set(span.pieces), self._clock)
            self._drop(candidate)
        for candidate, record in list(self._stragglers.items()):
            if not record.unread and record.touched < stale:
                del self._stragglers[candidate]
        for candidate in [s for s, span in self._kept.items() if span.pieces is None]:
            if self._kept_bytes + self._fetching_bytes + need <= self._max_bytes:
                break
            self._drop(candidate)
        return self._kept_bytes + self._fetching_bytes + need <= self._max_bytes

    def _drop(self, span_id: tuple[str, int]) -> None:
        span = self._kept.pop(span_id)
        self._kept_bytes -= span.size

    def _need(self, key: str, n: int, size: int) -> int:
        """The bytes span ``n`` takes: its length, or its declared ranges' pieces (which
        overlap where a shard's ranges do) if more."""
        low, high = n * self._span, min((n + 1) * self._span, size)
        known = self.config.ranges.get(key)
        if known is None:
            return high - low
        starts, ends = known
        first, last = bisect.bisect_right(ends, low), bisect.bisect_left(starts, high)
        pieces = zip(starts[first:last], ends[first:last], strict=True)
        return max(high - low, sum(min(int(b), high) - max(int(a), low) for a, b in pieces))

    def _clip(self, n: int, byte_range: ByteRange) -> tuple[int, int]:
        low = n * self._span
        return max(byte_range.start, low), min(byte_range.end, low + self._span)

    def _read_from(self, key: str, n: int, byte_range: ByteRange) -> None:
        """Count a read of span ``n``: its piece of a declared range is let go, and the span
        with its last one."""
        span = self._kept.get((key, n))
        if span is None:
            return
        span.last_read = self._clock
        self._kept.move_to_end((key, n))
        if span.pieces is not None:
            piece = span.pieces.pop(self._clip(n, byte_range), None)
            if piece is not None:
                span.size -= len(piece)
                self._kept_bytes -= len(piece)
            if not span.pieces:
                self._drop((key, n))

    # ------------------------------------------------------------------ fetching

    async def _piece(
        self, key: str, n: int, size: int, byte_range: ByteRange
    ) -> tuple[bytes | None, bool]:
        """Span ``n``'s piece of ``byte_range`` (None: not kept) and whether this read waited
        for the span's GET."""
        span_id = (key, n)
        start, end = self._clip(n, byte_range)
        record = self._stragglers.get(span_id)
        if record is not None:
            if (start, end) in record.unread or self._clock - record.touched <= self._max_bytes:
                record.unread.discard((start, end))
                record.touched = self._clock
                return None, False
            del self._stragglers[span_id]  # read again much later: a new pass over the span
        kept = self._kept.get(span_id)
        if kept is not None:
            if kept.pieces is not None:
                return _within(kept.pieces, start, end), False
            data, fetched = kept.data, False
        else:
            task = self._fetching.get(span_id)
            if task is None:
                span = ByteRange(n * self._span, min((n + 1) * self._span, size))
                task = asyncio.get_running_loop().create_task(self.inner.get(key, span))
                self._fetching[span_id] = task
                need = self._need(key, n, size)
                self._fetching_bytes += need
                task.add_done_callback(partial(self._arrive, key, n, need))
            # a cancelled caller leaves the GET to the others
            data, fetched = (await asyncio.shield(task)).data, True
        offset = n * self._span
        with memoryview(data) as view:  # type: ignore[arg-type]
            return bytes(view[start - offset : end - offset]), fetched

    def _arrive(self, key: str, n: int, need: int, task: asyncio.Task[Body]) -> None:
        del self._fetching[(key, n)]
        self._fetching_bytes -= need
        if task.cancelled() or task.exception() is not None:
            return  # its waiters got the error; the next read of the span GETs it again
        data = task.result().data
        span = _Span(data, None, len(data), self._clock)
        known = self.config.ranges.get(key)
        if known is not None:  # keep the declared ranges' bytes only
            starts, ends = known
            low, high = n * self._span, n * self._span + len(data)
            first, last = bisect.bisect_right(ends, low), bisect.bisect_left(starts, high)
            with memoryview(data) as view:
                span.pieces = {}
                for start, end in zip(starts[first:last], ends[first:last], strict=True):
                    a, b = max(int(start), low), min(int(end), high)
                    span.pieces[(a, b)] = bytes(view[a - low : b - low])
            span.data, span.size = None, sum(map(len, span.pieces.values()))
            if not span.pieces:
                return
        self._kept[(key, n)] = span
        self._kept_bytes += span.size

    # ------------------------------------------------------------------ the rest

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
        self._stragglers.clear()
        self._kept_bytes = 0
        await self.inner.close()


def _within(pieces: dict[tuple[int, int], bytes], start: int, end: int) -> bytes | None:
    """The bytes ``start`` to ``end`` from the piece that is exactly that range, or holds it
    (a part of a sample read in parts), or None."""
    piece = pieces.get((start, end))
    if piece is not None:
        return piece
    for (low, high), data in pieces.items():
        if low <= start and end <= high:
            return data[start - low : end - low]
    return None
