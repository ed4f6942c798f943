"""The contract between the loader and a storage backend.

A backend is a **store config** (:class:`StoreConfig`: frozen, hashable, picklable; a root
and the backend's options; travels to workers) and a **store** (:class:`Store`), opened
inside the process (and event loop) that uses it, so nothing opened crosses a ``fork``.
A store does one attempt per call and raises a
:class:`~concurrent_loader.errors.FetchError` naming the object; retries, limits, hedging
and metrics are the fetch client's. Callers check :class:`Capabilities`, never the scheme.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from ..config import FetchConfig
from .checksum import Checksum

__all__ = [
    "Body",
    "ByteRange",
    "Capabilities",
    "DelimitedStore",
    "Level",
    "ObjectInfo",
    "Store",
    "StoreConfig",
]


@dataclass(frozen=True)
class Capabilities:
    """What a backend can do. ``remote``: reads go over the network (False: the store also
    reads without a loop, ``get_blocking``, in the decode job); ``listing``: ``list`` works;
    ``ranges``: ``get`` honours ``byte_range``; ``whole_reads_up_to``: a whole object up to
    this many bytes is read with one ``get``, never in parts (0: any may go in parts);
    ``delimiter_listing``: the store is a :class:`DelimitedStore` (``list_level`` lists one
    prefix, one level at a time if asked), so a root is listed by prefixes in parallel."""

    remote: bool
    listing: bool
    ranges: bool
    whole_reads_up_to: int = 0
    delimiter_listing: bool = False


@dataclass(frozen=True, slots=True)
class ByteRange:
    """Bytes ``start`` (inclusive) to ``end`` (exclusive) of an object."""

    start: int
    end: int

    def __post_init__(self) -> None:
        if not 0 <= self.start < self.end:
            raise ValueError(f"invalid byte range [{self.start}, {self.end})")

    @property
    def length(self) -> int:
        return self.end - self.start


@dataclass(frozen=True, slots=True)
class ObjectInfo:
    """One listed object: its key relative to the store's root, and its size in bytes."""

    key: str
    size: int


@dataclass(frozen=True, slots=True)
class Level:
    """What one prefix holds: its objects (keys relative to the store's root) and, listed
    by level, its sub-prefixes up to the next ``/`` (relative to the root, ending in ``/``),
    whose objects are not in ``objects``; ``truncated``: only the first of several pages
    was asked for."""

    objects: list[ObjectInfo]
    prefixes: list[str]
    truncated: bool = False


@dataclass(slots=True)
class Body:
    """A successful read: the bytes, the time to first byte when known, the object's ETag,
    whether a round trip served it (False: a wrapper served bytes it holds, so the limit and
    the hedge delay take no latency sample), and, for a range only, the whole object's
    checksum, unchecked (checked once the parts are assembled: :mod:`..fetch.parts`)."""

    data: bytes | bytearray
    first_byte_s: float | None = None
    etag: str | None = None
    round_trip: bool = True
    object_checksum: Checksum | None = None


@runtime_checkable
class Store(Protocol):
    """An open store, bound to one process (and, when remote, one event loop)."""

    capabilities: Capabilities

    def url_for(self, key: str) -> str:
        """The object's name for messages (``s3://bucket/key``); never holds credentials."""
        ...

    async def get(self, key: str, byte_range: ByteRange | None = None) -> Body: ...

    def list(self) -> AsyncIterator[ObjectInfo]:
        """Every object under the root, keys relative to it, in any order."""
        ...

    async def close(self) -> None: ...


@runtime_checkable
class DelimitedStore(Store, Protocol):
    """A store that lists one prefix at a time (``capabilities.delimiter_listing``)."""

    async def list_level(
        self, prefix: str, *, delimited: bool, first_page: int | None = None
    ) -> Level:
        """The objects under ``prefix`` (relative to the root, ``""`` or ending in ``/``):
        with ``delimited``, only those up to the next ``/`` and the sub-prefixes below it,
        else every one (``prefixes`` empty); with ``first_page``, only a first page of at
        most that many. Failures name the prefix (``s3://bucket/prefix/``)."""
        ...


class BlockingStore(Store, Protocol):
    """A store that also reads without an event loop (``capabilities.remote`` is False)."""

    def get_blocking(self, key: str, byte_range: ByteRange | None = None) -> bytes: ...

    def list_blocking(self) -> Iterator[ObjectInfo]: ...


class StoreConfig(Protocol):
    """A root and its backend's options: frozen, hashable, picklable."""

    @property
    def capabilities(self) -> Capabilities: ...

    def url_for(self, key: str) -> str: ...

    def resolved(self) -> StoreConfig:
        """This config with what can be resolved once (an S3 route) resolved, for workers."""
        ...

    def open(self, fetch: FetchConfig) -> Store:
        """A store for this process (a remote one on the runtime's loop)."""
        ...
