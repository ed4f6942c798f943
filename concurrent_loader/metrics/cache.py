"""What the node-local caches of this process did: hits, misses and bytes served.

A cache sits inside the store the fetch client wraps, where no pipeline's observer reaches,
so it counts into this one process-wide :class:`CacheTally`. A pipeline's
:class:`~concurrent_loader.metrics.StageStats` made by ``SharedStats.read`` reports what
the tally gained while the pipeline ran (the tally at its start is its baseline), so its
row in shared memory holds that process's cache counts. Two loaders reading through a
cache at the same time in one process both see the process's combined counts.
"""

from __future__ import annotations

import threading

__all__ = ["CacheTally", "cache_tally"]


class CacheTally:
    """Thread-safe counters: reads served from the cache (``hits``, ``bytes``), reads that
    went to the store (``misses``)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0
        self.bytes = 0

    def hit(self, size: int) -> None:
        with self._lock:
            self.hits += 1
            self.bytes += size

    def miss(self) -> None:
        with self._lock:
            self.misses += 1

    def snapshot(self) -> tuple[int, int, int]:
        """(hits, misses, bytes), read together."""
        with self._lock:
            return self.hits, self.misses, self.bytes


_TALLY = CacheTally()


def cache_tally() -> CacheTally:
    """This process's tally (a forked child goes on from its parent's counts; pipelines
    count from their own start, so that does not matter)."""
    return _TALLY
