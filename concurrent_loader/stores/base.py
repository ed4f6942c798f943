"""The contract between the loader and a storage backend.

A backend is a **store config** (:class:`StoreConfig`: frozen, hashable, picklable; names a
root and holds the backend's options; travels to workers with the dataset) and a **store**
(:class:`Store`), made by :meth:`StoreConfig.open` inside the process (and, when remote, the
event loop) that uses it, so no socket, client or resolved credential crosses a ``fork``.

A store does one attempt per call: ``get`` returns the object's bytes (or the byte range
asked for) or raises a :class:`~concurrent_loader.errors.FetchError` naming the object.
Retries, limits, hedging and metrics belong to the fetch client (:mod:`concurrent_loader.fetch`).
Callers check :class:`Capabilities`, never the URL scheme.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from ..config import FetchConfig
from .checksum import Checksum

__all__ = ["Body", "ByteRange", "Capabilities", "ObjectInfo", "Store", "StoreConfig"]


@dataclass(frozen=True)
class Capabilities:
    """What a backend can do.

    - ``remote``: reads go over the network through the asyncio ``get``; when False the
      store also reads without an event loop (``get_blocking``, ``list_blocking``), and the
      pipeline reads and decodes in one thread-pool job;
    - ``listing``: ``list`` works (plain HTTP cannot list: keys come from the caller);
    - ``ranges``: ``get`` honours ``byte_range``;
    - ``whole_reads_up_to``: a whole object up to this many bytes is read with one ``get``,
      never split into ranged parts (a wrapper that keeps whole objects keeps it from one
      read; 0: any large read may go in parts).
    """

    remote: bool
    listing: bool
    ranges: bool
    whole_reads_up_to: int = 0


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


@dataclass(slots=True)
class Body:
    """A successful read: the bytes, the time to first byte when the transport knows it, the
    object's ETag when the store gives one (a cache keeps it with the entry),
    whether a round trip to the store served it (False: a wrapper served it from bytes it
    holds, so its time says nothing about the store's latency, and the in-flight limit and
    the hedge delay take no sample from it), and, for a byte range only, the whole object's
    checksum as the store gave it, unchecked (a whole body is checked by its store before it
    is returned; the fetch client checks the object once its parts are assembled,
    :mod:`concurrent_loader.fetch.parts`)."""

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

    async def get(self, key: str, byte_range: ByteRange | None = None) -> Body:
        """One attempt at the object (or ``byte_range`` of it), or a ``FetchError``."""
        ...

    def list(self) -> AsyncIterator[ObjectInfo]:
        """Every object under the root, keys relative to it, in any order."""
        ...

    async def close(self) -> None:
        """Release connections. Idempotent."""
        ...


class BlockingStore(Store, Protocol):
    """A store that also reads without an event loop (``capabilities.remote`` is False)."""

    def get_blocking(self, key: str, byte_range: ByteRange | None = None) -> bytes:
        """The object (or ``byte_range`` of it), read on the calling thread."""
        ...

    def list_blocking(self) -> Iterator[ObjectInfo]:
        """Every object under the root, on the calling thread."""
        ...


class StoreConfig(Protocol):
    """A root and its backend's options: frozen, hashable, picklable."""

    @property
    def capabilities(self) -> Capabilities: ...

    def url_for(self, key: str) -> str:
        """The name of object ``key`` (relative to the root) as users write it."""
        ...

    def resolved(self) -> StoreConfig:
        """This config with what can be resolved once resolved (in the main process, when a
        dataset is made: an S3 route), so worker processes need not."""
        ...

    def open(self, fetch: FetchConfig) -> Store:
        """A store for this process. Remote stores are opened on the runtime's loop."""
        ...
