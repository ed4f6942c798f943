"""Filling a cache ahead of training: every object of a dataset read once through it.

Misses go through this process's fetch client, ``max_inflight_requests`` at a time; every
``FLUSH_EVERY`` objects it waits for the writer, so a slow disk slows the warm-up instead of
leaving objects out. An object that fails to read fails the warm-up with its error.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..config import FetchConfig
from ..metrics.stats import cache_tally
from ..runtime import acquire_runtime
from .cached import CachedStoreConfig
from .form import apply_in_pool, process_pool

__all__ = ["FLUSH_EVERY", "WarmReport", "warm_cache"]

FLUSH_EVERY = 256


@dataclass(frozen=True)
class WarmReport:
    """What a warm-up read: objects, bytes (in the cache's form), and those cached already."""

    objects: int
    bytes: int
    already_cached: int


def warm_cache(
    store: CachedStoreConfig,
    keys: Sequence[str],
    config: FetchConfig | None = None,
    on_object: Callable[[], None] | None = None,
    processes: int | None = None,
) -> WarmReport:
    """Read every key of ``store`` through its cache; ``on_object`` is called after each.
    With ``store.cache.presize``, objects are put in that form by ``processes`` processes
    (default: one per core)."""
    fetch = config or FetchConfig()

    async def warm(pool: concurrent.futures.Executor | None) -> WarmReport:
        cached = store.through_client(fetch)
        if pool is not None:
            cached.apply = apply_in_pool(pool)
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

    with contextlib.ExitStack() as stack:
        pool = None
        if store.cache.presize is not None and keys:
            pool = stack.enter_context(process_pool(processes))
        runtime = acquire_runtime()
        try:
            return runtime.run(warm(pool))
        finally:
            runtime.release()
