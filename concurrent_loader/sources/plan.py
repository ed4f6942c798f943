"""How a batch's reads become GETs: merged with neighbours (coalesced), whole, or in parts.

Pure functions, no I/O. :func:`plan_fetches` is the one place that decides, for a batch's
samples, which GETs are made and how each one is read (see its docstring); the pipeline
only carries the plan out.

Coalescing (:func:`plan_reads`): as arrow-rs ``object_store::coalesce_ranges`` does, the
ranges of one key are sorted by start and a range joins the previous merged range when it
starts at most ``max_gap`` bytes after that one's end (overlapping and adjacent ranges
included); unlike it, a merged range also stops growing at ``max_bytes`` (a single read larger than
that stays whole), so one merged GET never holds more than that against the byte budget.
Each merged read carries its parts: which read it serves and where that read's bytes lie
inside the merged body.

Guarantees: every read given is served by exactly one merged read; a part's slice of its
merged body is exactly the bytes its read asked for; no merged read is larger than
``max_bytes`` unless it is one read; merged reads of one key overlap only where the reads
they serve overlap; reads without a byte range (whole objects) are never merged.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from ..fetch.parts import PartsConfig
from ..stores.base import ByteRange, Capabilities
from .base import Read

__all__ = [
    "Coalescing",
    "Get",
    "MergedRead",
    "Part",
    "Shared",
    "Whole",
    "plan_fetches",
    "plan_reads",
]

Tag = TypeVar("Tag", bound=Hashable)

DEFAULT_MAX_GAP = 1 << 20  # as object_store's OBJECT_STORE_COALESCE_DEFAULT
DEFAULT_MAX_BYTES = 16 << 20


@dataclass(frozen=True)
class Coalescing:
    """When two ranged reads of one object become one GET: the gap between them is at most
    ``max_gap`` bytes and the merged read stays within ``max_bytes``. ``max_gap=0`` merges
    only adjacent or overlapping ranges; ``enabled=False`` turns merging off (one GET per
    read, overlapping or not)."""

    max_gap: int = DEFAULT_MAX_GAP
    max_bytes: int = DEFAULT_MAX_BYTES
    enabled: bool = True

    def __post_init__(self) -> None:
        if self.max_gap < 0:
            raise ValueError(f"max_gap must be >= 0, got {self.max_gap}")
        if self.max_bytes < 1:
            raise ValueError(f"max_bytes must be >= 1, got {self.max_bytes}")


@dataclass(frozen=True, slots=True)
class Part(Generic[Tag]):
    """Read ``tag`` is bytes ``start:end`` of its merged body (``end`` None: all of it)."""

    tag: Tag
    start: int
    end: int | None

    def of(self, body: bytes | bytearray) -> bytes:
        return bytes(memoryview(body)[self.start : self.end])


@dataclass(frozen=True, slots=True)
class MergedRead(Generic[Tag]):
    """One GET (``read``) and the reads it serves."""

    read: Read
    parts: tuple[Part[Tag], ...]


def _joins(current: ByteRange, nxt: ByteRange, coalescing: Coalescing) -> bool:
    if not coalescing.enabled:
        return False
    if max(current.end, nxt.end) - current.start > coalescing.max_bytes:
        return False  # even an overlapping read: the merged GET is reserved whole
    return nxt.start - current.end <= coalescing.max_gap


def plan_reads(reads: Sequence[tuple[Tag, Read]], coalescing: Coalescing) -> list[MergedRead[Tag]]:
    """The GETs that serve ``reads`` (``(tag, read)`` pairs), in the order of the first read
    each serves, so the batch's first samples are asked for first."""
    by_key: dict[str, list[tuple[int, Tag, ByteRange]]] = {}
    planned: list[tuple[int, MergedRead[Tag]]] = []
    for order, (tag, read) in enumerate(reads):
        if read.byte_range is None:
            planned.append((order, MergedRead(read, (Part(tag, 0, None),))))
        else:
            by_key.setdefault(read.key, []).append((order, tag, read.byte_range))
    for key, ranged in by_key.items():
        ranged.sort(key=lambda item: (item[2].start, item[2].end))
        groups: list[tuple[ByteRange, list[tuple[int, Tag, ByteRange]]]] = []
        for item in ranged:
            r = item[2]
            if groups and _joins(groups[-1][0], r, coalescing):
                span, members = groups[-1]
                members.append(item)
                groups[-1] = (ByteRange(span.start, max(span.end, r.end)), members)
            else:
                groups.append((r, [item]))
        for span, members in groups:
            parts = tuple(
                Part(tag, r.start - span.start, r.end - span.start) for _, tag, r in members
            )
            first = min(order for order, _, _ in members)
            planned.append((first, MergedRead(Read(key, span, span.length), parts)))
    planned.sort(key=lambda item: item[0])
    return [merged for _, merged in planned]


@dataclass(frozen=True, slots=True)
class Get:
    """One GET of ``read``: ``in_parts`` is its size when it goes as ranged parts in flight
    (:func:`~concurrent_loader.fetch.parts.read_in_parts`), None for one plain GET;
    ``reserve`` is what it reserves in the byte budget (None: the budget's estimate)."""

    read: Read
    in_parts: int | None = None
    reserve: int | None = None


@dataclass(frozen=True, slots=True)
class Whole(Generic[Tag]):
    """Sample ``tag`` is decoded from the bodies of ``gets``, in order."""

    tag: Tag
    gets: tuple[Get, ...]


@dataclass(frozen=True, slots=True)
class Shared(Generic[Tag]):
    """One GET whose body holds the bytes of several reads (:class:`Part`: which, where)."""

    get: Get
    parts: tuple[Part[Tag], ...]


def plan_get(read: Read, capabilities: Capabilities, parts: PartsConfig) -> Get:
    """A read larger than ``parts.part_size`` goes in parts when the store serves ranges,
    unless it is a whole object the store wants in one read (a cache fills its entry from
    it); in parts it reserves its buffer and the parts in flight, else its expected size."""
    size = read.byte_range.length if read.byte_range is not None else read.size
    if (
        size is None
        or not parts.applies(size)
        or not capabilities.ranges
        or (read.byte_range is None and size <= capabilities.whole_reads_up_to)
    ):
        return Get(read, None, read.size)
    return Get(read, size, parts.reservation(size))


def plan_fetches(
    samples: Sequence[tuple[Tag, Sequence[Read]]],
    capabilities: Capabilities,
    parts: PartsConfig,
    coalescing: Coalescing | None,
    max_bytes: int,
) -> list[Whole[Tag] | Shared[Tag]]:
    """The fetches of a batch's ``samples`` (``(tag, reads)`` pairs, in sampler order).

    Without ``coalescing`` each sample is one :class:`Whole`, in order. With it, a sample of
    one read is merged with the batch's other reads of its object (:func:`plan_reads`, the
    merged reads kept within ``max_bytes``, the byte budget, as each is reserved whole), and
    a sample of several reads stays :class:`Whole`; the Wholes come first. Each GET is then
    planned by :func:`plan_get`."""

    def whole(tag: Tag, reads: Sequence[Read]) -> Whole[Tag]:
        return Whole(tag, tuple(plan_get(read, capabilities, parts) for read in reads))

    if coalescing is None:
        return [whole(tag, reads) for tag, reads in samples]
    if coalescing.max_bytes > max_bytes:
        coalescing = dataclasses.replace(coalescing, max_bytes=max_bytes)
    fetches: list[Whole[Tag] | Shared[Tag]] = [
        whole(tag, reads) for tag, reads in samples if len(reads) != 1
    ]
    single = [(tag, reads[0]) for tag, reads in samples if len(reads) == 1]
    for merged in plan_reads(single, coalescing):
        fetches.append(Shared(plan_get(merged.read, capabilities, parts), merged.parts))
    return fetches
