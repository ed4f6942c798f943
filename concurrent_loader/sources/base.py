"""The contract between datasets and the pipeline: a :class:`SampleSource` turns an index
into reads from one store and, given their bytes, into the sample (on a decode thread). A
source is picklable and holds no open resource.

How a sample's reads become GETs, each whole or in ranged parts: pure functions, the one
place that decides (:func:`plan_fetches`). Every read is its own GET; reads of one object
are never merged."""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar, runtime_checkable

from ..config import FetchConfig
from ..fetch.parts import PartsConfig
from ..stores.base import ByteRange, Capabilities, StoreConfig

__all__ = ["Get", "NamingSource", "Read", "SampleSource", "Whole", "plan_fetches", "plan_get"]

Tag = TypeVar("Tag", bound=Hashable)


@dataclass(frozen=True, slots=True)
class Read:
    """One read of a sample: ``key`` of the source's store, all of it or ``byte_range``;
    ``size`` is the body's expected size when known (it feeds the byte budget)."""

    key: str
    byte_range: ByteRange | None = None
    size: int | None = None


@runtime_checkable
class SampleSource(Protocol):
    store: StoreConfig
    fetch_config: FetchConfig

    def __len__(self) -> int: ...

    def reads(self, index: int) -> Sequence[Read]:
        """The reads sample ``index`` (in range) needs."""

    def decode(self, index: int, bodies: Sequence[bytes | bytearray]) -> Any:
        """Sample ``index`` from the bodies of its reads, in order."""

    def url_for(self, index: int) -> str:
        """The name of sample ``index`` in messages."""


@runtime_checkable
class NamingSource(SampleSource, Protocol):
    """A source whose samples are parts of larger objects (tar shards), which names the
    sample in the error of a failed read itself."""

    def read_failed(self, index: int, exc: BaseException) -> BaseException:
        """``exc``, a failed read of sample ``index``, as the same kind of error naming the
        sample's object, member and offset."""


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


def plan_get(read: Read, capabilities: Capabilities, parts: PartsConfig) -> Get:
    """A read larger than ``parts.part_size`` goes in parts when the store serves ranges,
    unless it is a whole object the store wants in one read (a cache fills its entry from it)."""
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
    samples: Sequence[tuple[Tag, Sequence[Read]]], capabilities: Capabilities, parts: PartsConfig
) -> list[Whole[Tag]]:
    return [
        Whole(tag, tuple(plan_get(read, capabilities, parts) for read in reads))
        for tag, reads in samples
    ]
