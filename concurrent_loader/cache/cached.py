"""A remote store's config read through the node-local cache: :class:`CachedStoreConfig`.

What a dataset holds and pickles to its workers; it opens a :class:`~.store.CachedStore`,
and tells whether the cache holds the whole dataset (then the pipeline takes the local
directories' path).
"""

from __future__ import annotations

import dataclasses
import os
import random
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from ..config import FetchConfig
from ..errors import ConfigError
from ..runtime import Runtime
from ..stores.base import Body, ByteRange, Capabilities, StoreConfig
from .directory import CacheConfig, name_for, read_ledger
from .form import form_tag
from .layout import CACHE_ERRORS, Handles, on_entry
from .store import CachedStore, Read
from .writer import MAX_ENTRY_BYTES

__all__ = ["MAX_ENTRY_BYTES", "CachedStoreConfig", "Client"]

#: keys of the dataset sampled to tell whether the cache holds all of it
SAMPLE_KEYS = 64


class Client(Protocol):
    """What the cache reads misses through off the remote path: a fetch client."""

    async def get_body(self, key: str, byte_range: ByteRange | None = None) -> Body: ...


@dataclass(frozen=True)
class CachedStoreConfig:
    """``inner`` (a remote store's config) read through the node-local cache ``cache``."""

    inner: StoreConfig
    cache: CacheConfig
    #: the dataset's size and a sample of its keys (:meth:`for_keys`)
    object_count: int = 0
    sample_keys: tuple[str, ...] = ()
    #: this process's fetch client for a store config (``fetch.client_for``): off the remote
    #: path misses are read through it; without it, no local path and no warm-up
    client_for: Callable[[Runtime, StoreConfig, FetchConfig], Awaitable[Client]] | None = None

    def __post_init__(self) -> None:
        if not self.inner.capabilities.remote:
            raise ConfigError(
                f"{self.inner.url_for('')} is on local disk already: it needs no cache",
                url=self.inner.url_for(""),
            )

    @property
    def capabilities(self) -> Capabilities:
        """Those of a store opened now, fixed for its life: the wrapped store's, except
        ``remote`` is False once the cache holds the whole dataset (:meth:`complete`)."""
        inner = self.inner.capabilities
        if self.client_for is not None and self.complete():
            return Capabilities(remote=False, listing=inner.listing, ranges=inner.ranges)
        # An object read in parts would reach the cache as ranges, which it does not keep.
        return dataclasses.replace(inner, whole_reads_up_to=MAX_ENTRY_BYTES)

    def complete(self) -> bool:
        """Whether the cache seems to hold every object of the dataset: its ledger counts at
        least ``object_count`` entries and every sampled key has one. Once found so, taken
        as so for the rest of the process (a miss is still fetched, and cached)."""
        if not self.object_count:
            return False
        if self in _FOUND_COMPLETE:
            return True
        directory = self.cache.directory
        if read_ledger(directory).entries < self.object_count:
            return False
        prefix = self.entry_prefix()
        try:
            handles = Handles.open(directory, create=False)
            try:
                names = (name_for(prefix + self.url_for(key)) for key in self.sample_keys)
                found = all(on_entry(handles.entries_fd, n, directory, os.lstat) for n in names)
            finally:
                handles.close()
        except CACHE_ERRORS:
            return False
        if found:
            _FOUND_COMPLETE.add(self)
        return found

    def for_keys(self, keys: Sequence[str]) -> CachedStoreConfig:
        """This config for a dataset of ``keys`` (their count and a fixed sample of them)."""
        count = len(keys)
        picks = random.Random(0).sample(range(count), min(count, SAMPLE_KEYS))
        return dataclasses.replace(
            self, object_count=count, sample_keys=tuple(keys[i] for i in sorted(picks))
        )

    def url_for(self, key: str) -> str:
        return self.inner.url_for(key)

    def entry_prefix(self) -> str:
        return form_tag(self.cache.presize) + source_prefix(self.inner)

    def resolved(self) -> CachedStoreConfig:
        return dataclasses.replace(self, inner=self.inner.resolved(), cache=self.cache.resolved())

    def open(self, fetch: FetchConfig) -> CachedStore:
        """A store for this process, its capabilities decided now: on the remote path around
        the inner store, opened here; else reading misses through the fetch client."""
        capabilities = self.capabilities
        if not capabilities.remote:
            return self.through_client(fetch, capabilities)
        prefix, inner = self.entry_prefix(), self.inner
        return CachedStore(self.cache, inner, fetch, capabilities, prefix, inner.open(fetch))

    def through_client(
        self, fetch: FetchConfig, capabilities: Capabilities | None = None
    ) -> CachedStore:
        """A store that reads misses through this process's fetch client (made on first use)."""
        client_for, inner = self.client_for, self.inner
        if client_for is None:
            raise ValueError(f"{self} was made without a fetch client (client_for)")

        async def connect(runtime: Runtime) -> Read:
            return (await client_for(runtime, inner, fetch)).get_body

        capabilities = capabilities or self.capabilities
        prefix = self.entry_prefix()
        return CachedStore(self.cache, inner, fetch, capabilities, prefix, connect=connect)

    def __str__(self) -> str:
        return str(self.inner)


#: the configs this process found complete (a dataset's config each: a handful)
_FOUND_COMPLETE: set[CachedStoreConfig] = set()


def source_prefix(inner: StoreConfig) -> str:
    """Where ``inner``'s bytes come from, in front of every entry's source, so two stores
    whose URLs read alike (one bucket on two endpoints) never share an entry: an S3 store's
    resolved route (origin and path, no credential); nothing for URLs that name their host."""
    config: Any = inner
    while hasattr(config, "inner"):
        config = config.inner
    if not hasattr(config, "route"):
        return ""
    route = config.route or config.resolved().route
    origin = route.origin
    return f"{origin.scheme}://{origin.host_header}{route.path_prefix} "
