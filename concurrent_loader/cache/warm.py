"""Filling a cache ahead of training: every object of a dataset read once through it.

Misses go through this process's fetch client (its retries, limits and hedges),
``max_inflight_requests`` at a time; every ``FLUSH_EVERY`` objects it waits for the writer,
so a slow disk slows the warm-up instead of leaving objects out. An object that fails to
read fails the warm-up with its error.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..config import FetchConfig
from ..metrics.stats import cache_tally
from ..runtime import acquire_runtime
from .cached import CachedStoreConfig

__all__ = ["FLUSH_EVERY", "WarmReport", "warm_cache"]

FLUSH_EVERY = 256


@dataclass(frozen=True)
class WarmReport:
    """What a warm-up read: objects, bytes, and how many were in the cache already."""

    objects: int
    bytes: int
    already_cached: int


def warm_cache(
    store: CachedStoreConfig,
    keys: Sequence[str],
    config: FetchConfig | None = None,
    on_object: Callable[[], None] | None = None,
) -> WarmReport:
    """Read every key of ``store`` through its cache; ``on_object`` is called after each."""
    fetch = config or FetchConfig()
    runtime = acquire_runtime()
    try:
        return runtime.run(_warm(store, keys, fetch, on_object))
    finally:
        runtime.release()


async def _warm(
    store: CachedStoreConfig,
    keys: Sequence[str],
    fetch: FetchConfig,
    on_object: Callable[[], None] | None,
) -> WarmReport:
    cached = store.through_client(fetch)
    hits_before = cache_tally().snapshot()[0]
    total = 0
    slots = asyncio.Semaphore(fetch.inflight_cap)

    async def one(key: str) -> None:
        nonlocal total
        async with slots:
            total += len((await cached.get(key)).data)
        if on_object is not None:
            on_object()

    try:
        for start in range(0, len(keys), FLUSH_EVERY):
            await asyncio.gather(*(one(key) for key in keys[start : start + FLUSH_EVERY]))
            await cached.flush()
    finally:
        await cached.close()
    return WarmReport(len(keys), total, cache_tally().snapshot()[0] - hits_before)
