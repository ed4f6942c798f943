"""Listing a store's root, with an optional progress bar, for datasets and the command line.

Keys are relative to the root and sorted (the same order locally and on S3), without S3
"directory" markers; an empty root, or a store that cannot list, is a ``ConfigError``
naming it.

A store with ``capabilities.delimiter_listing`` is listed by prefixes, in parallel
(:func:`list_by_prefixes`), when that pays: a root whose first page (1,000 keys, S3's
page) holds all of it is that one request, as sequentially. A larger one is listed level
by level (one ``/``-delimited listing of each prefix, all of a level at once) while a
level has fewer prefixes than the listings allowed in flight (``FetchConfig.inflight_start``),
then each prefix of the last level is listed whole, that many at a time. Every object is
listed exactly once (a level's objects and its sub-prefixes are disjoint), so the sorted
result is the sequential listing's. A root whose prefixes hold few objects each costs one
request per prefix, more than the sequential listing's one per 1,000 keys, though that
many at a time. Other stores are listed as one sequence.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager

from .config import FetchConfig
from .errors import ConfigError, Reason
from .runtime import acquire_runtime
from .stores.base import BlockingStore, DelimitedStore, ObjectInfo, StoreConfig

__all__ = ["FIRST_PAGE_KEYS", "empty_root", "list_by_prefixes", "list_store", "progress"]


def list_store(
    store: StoreConfig,
    config: FetchConfig | None = None,
    *,
    on_object: Callable[[], None] | None = None,
) -> list[ObjectInfo]:
    config = config or FetchConfig()
    capabilities = store.capabilities
    if not capabilities.listing:
        raise ConfigError(
            f"{store} cannot be listed: pass keys= or a manifest", url=store.url_for("")
        )
    found: list[ObjectInfo] = []

    def keep(info: ObjectInfo) -> None:
        if info.key and not info.key.endswith("/"):
            found.append(info)
            if on_object is not None:
                on_object()

    if not capabilities.remote:
        blocking: BlockingStore = store.open(config)  # type: ignore[assignment]
        for info in blocking.list_blocking():
            keep(info)
    else:

        async def collect() -> None:
            opened = store.open(config)
            try:
                # A wrapper may pass on its inner store's capabilities without the method.
                if capabilities.delimiter_listing and isinstance(opened, DelimitedStore):
                    await list_by_prefixes(opened, config.inflight_start, keep)
                else:
                    async for info in opened.list():
                        keep(info)
            finally:
                await opened.close()

        runtime = acquire_runtime()
        try:
            runtime.run(collect())
        finally:
            runtime.release()
    found.sort(key=lambda item: item.key)
    if not found:
        raise empty_root(store, f"no objects under {store}")
    return found


#: a root whose first page of this many keys holds all of it is not split
FIRST_PAGE_KEYS = 1000


async def list_by_prefixes(
    store: DelimitedStore,
    width: int,
    keep: Callable[[ObjectInfo], None],
    *,
    first_page: int = FIRST_PAGE_KEYS,
) -> None:
    """Give ``keep`` every object under ``store``'s root, listing at most ``width`` prefixes
    at a time (see the module's docstring); the first failure cancels the rest and is
    raised as it is (naming its prefix)."""
    small = await store.list_level("", delimited=False, first_page=first_page)
    if not small.truncated:
        for info in small.objects:
            keep(info)
        return

    async def each(prefixes: list[str], delimited: bool) -> list[str]:
        """List ``prefixes`` by ``width`` workers; returns the sub-prefixes found."""
        below: list[str] = []
        queue = iter(prefixes)

        async def worker() -> None:
            for prefix in queue:
                level = await store.list_level(prefix, delimited=delimited)
                for info in level.objects:
                    keep(info)
                below.extend(level.prefixes)

        await _all_or_none([worker() for _ in range(min(width, len(prefixes)))])
        return below

    prefixes = [""]
    while prefixes and len(prefixes) < width:
        prefixes = await each(prefixes, delimited=True)
    await each(prefixes, delimited=False)


async def _all_or_none(workers: list[Awaitable[None]]) -> None:
    """Await ``workers`` together; the first failure cancels the others, then is raised."""
    tasks = [asyncio.ensure_future(worker) for worker in workers]
    try:
        await asyncio.gather(*tasks)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def empty_root(store: StoreConfig, message: str, key: str = "") -> ConfigError:
    """The error (``EmptyPrefix``) for a root ``store`` that holds nothing to read: ``message``
    names the root (or its object ``key``)."""
    return ConfigError(message, url=store.url_for(key), cause=Reason.EMPTY_PREFIX)


@contextmanager
def progress(enabled: bool, description: str) -> Iterator[Callable[[], None] | None]:
    """A per-object tick for a tqdm bar on stderr, or None without tqdm (or when disabled)."""
    if not enabled:
        yield None
        return
    try:
        from tqdm import tqdm
    except ImportError:
        yield None
        return
    with tqdm(desc=description, unit=" objects", file=sys.stderr, leave=False) as bar:
        yield lambda: bar.update(1)
