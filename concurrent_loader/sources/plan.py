"""How a sample's reads become GETs, each whole or in ranged parts: pure functions, the
one place that decides (:func:`plan_fetches`). Every read is its own GET; reads of one
object are never merged."""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from ..fetch.parts import PartsConfig
from ..stores.base import Capabilities
from .base import Read

__all__ = ["Get", "Whole", "plan_fetches", "plan_get"]

Tag = TypeVar("Tag", bound=Hashable)


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
    samples: Sequence[tuple[Tag, Sequence[Read]]],
    capabilities: Capabilities,
    parts: PartsConfig,
) -> list[Whole[Tag]]:
    return [
        Whole(tag, tuple(plan_get(read, capabilities, parts) for read in reads))
        for tag, reads in samples
    ]
