"""Per-stage counters and latency histograms, cheap to update and merged across processes.

Each process counts into a :class:`StageStats` and copies it after every batch into its row
of a shared-memory matrix (:class:`SharedStats`) the main process sums: no queue or lock
between processes. Latency histograms are log-scale (10 buckets per decade, 1 us to 1000 s),
so merging adds arrays and a percentile is its bucket's upper edge (about 26 % wide).
:func:`percentile` (nearest rank) is the project's one percentile function.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Sequence
from typing import Any

import torch

from ..errors import FetchError

__all__ = ["COUNTERS", "HISTOGRAMS", "CacheTally", "SharedStats", "StageStats", "cache_tally"]
__all__ += ["histogram_percentiles", "percentile"]

_PER_DECADE = 10
_LOW = 1e-6
BUCKETS = 9 * _PER_DECADE + 1
COUNTERS = (
    "objects",
    "bytes",
    "retries",
    "throttles",
    "skipped",
    "inflight",
    "inflight_limit",
    "decode_threads",
    "hedges",
    "hedges_won",
    "cache_hits",
    "cache_misses",
    "cache_bytes",
)
HISTOGRAMS = ("fetch", "decode", "first_byte")
_HIST_BASE = len(COUNTERS)
# per histogram: BUCKETS counts, then count and total seconds
_HIST_WIDTH = BUCKETS + 2
WIDTH = _HIST_BASE + len(HISTOGRAMS) * _HIST_WIDTH


def _bucket(seconds: float) -> int:
    if seconds <= _LOW:
        return 0
    return min(BUCKETS - 1, int(math.log10(seconds / _LOW) * _PER_DECADE) + 1)


#: upper edge (seconds) of each bucket
EDGES = [_LOW * 10 ** (i / _PER_DECADE) for i in range(BUCKETS)]


def percentile(
    values: Sequence[float], q: float, counts: Sequence[float] | None = None
) -> float | None:
    """The nearest-rank ``q``-th percentile (0-100) of ``values``; None when there are none.
    With ``counts`` (a histogram), ``values`` are sorted and ``values[i]`` occurred ``counts[i]``
    times."""
    if counts is None:
        ordered: Sequence[float] = sorted(values)
        weights: Sequence[float] = [1.0] * len(ordered)
    else:
        ordered, weights = values, counts
    total = sum(weights)
    if not total:
        return None
    rank = max(1.0, math.ceil(total * q / 100))
    seen = 0.0
    for value, weight in zip(ordered, weights, strict=True):
        seen += weight
        if seen >= rank:
            return value
    return ordered[-1]  # pragma: no cover - float rounding only


def histogram_percentiles(counts: list[float]) -> dict[str, float | None]:
    """p50, p95 and p99 of a histogram, each the upper edge of its bucket (seconds)."""
    return {f"p{q}": percentile(EDGES, q, counts) for q in (50, 95, 99)}


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
        with self._lock:
            return self.hits, self.misses, self.bytes


_TALLY = CacheTally()


def cache_tally() -> CacheTally:
    """This process's tally (pipelines count what it gains from their own start)."""
    return _TALLY


class StageStats:
    """What one process's pipeline did. Thread-safe; ``vector()`` is its flat form. It is the
    fetch client's :class:`~concurrent_loader.fetch.FetchObserver`."""

    def __init__(
        self, vector: list[float] | None = None, *, cache: CacheTally | None = None
    ) -> None:
        self._lock = threading.Lock()
        self._v = list(vector) if vector is not None else [0.0] * WIDTH
        # With ``cache``, the cache counters also hold what that tally gains from now on.
        self._cache = cache
        self._cache_base = cache.snapshot() if cache is not None else (0, 0, 0)

    def _add_latency(self, histogram: int, seconds: float) -> None:
        base = _HIST_BASE + histogram * _HIST_WIDTH
        self._v[base + _bucket(seconds)] += 1
        self._v[base + BUCKETS] += 1
        self._v[base + BUCKETS + 1] += seconds

    def add_fetch(self, seconds: float, size: int, first_byte_s: float | None = None) -> None:
        with self._lock:
            self._add_latency(0, seconds)
            if first_byte_s is not None:
                self._add_latency(2, first_byte_s)
            self._v[0] += 1
            self._v[1] += size

    on_response = add_fetch  # as the fetch client's observer

    def on_retry(self, error: FetchError) -> None:
        self.add("retries")

    def on_throttle(self) -> None:
        self.add("throttles")

    def on_hedge(self) -> None:
        self.add("hedges")

    def on_hedge_won(self) -> None:
        self.add("hedges_won")

    def add_decode(self, seconds: float) -> None:
        with self._lock:
            self._add_latency(1, seconds)

    def add(self, counter: str, amount: float = 1) -> None:
        with self._lock:
            self._v[COUNTERS.index(counter)] += amount

    def set(self, counter: str, value: float) -> None:
        with self._lock:
            self._v[COUNTERS.index(counter)] = value

    def histogram(self, name: str) -> dict[str, Any]:
        base = _HIST_BASE + HISTOGRAMS.index(name) * _HIST_WIDTH
        with self._lock:
            v = self._v
            return {
                "counts": v[base : base + BUCKETS],
                "count": v[base + BUCKETS],
                "total": v[base + BUCKETS + 1],
            }

    def vector(self) -> list[float]:
        with self._lock:
            v = list(self._v)
        if self._cache is not None:
            now = self._cache.snapshot()
            first = COUNTERS.index("cache_hits")
            for i, (value, base) in enumerate(zip(now, self._cache_base, strict=True)):
                v[first + i] += value - base
        return v

    def __reduce__(self) -> tuple[Any, ...]:
        return (StageStats, (self.vector(),))


class SharedStats:
    """One row per process (row 0: the main process, row ``w + 1``: worker ``w``), in shared
    memory, so rows written by workers are visible to the main process at any time."""

    def __init__(self, num_workers: int) -> None:
        self.rows = torch.zeros((num_workers + 1, WIDTH), dtype=torch.float64).share_memory_()

    def write(self, row: int, stats: StageStats) -> None:
        self.rows[row] = torch.tensor(stats.vector(), dtype=torch.float64)

    def read(self, row: int) -> StageStats:
        return StageStats(self.rows[row].tolist(), cache=cache_tally())

    def published_mean(self, counter: str) -> float | None:
        """A gauge's mean over the processes that have set it (None: none has yet)."""
        column = self.rows[:, COUNTERS.index(counter)]
        published = column[column > 0]
        return float(published.mean()) if len(published) else None

    def total(self) -> dict[str, Any]:
        summed = StageStats(self.rows.sum(0).tolist())
        vector = summed.vector()
        out: dict[str, Any] = {name: vector[i] for i, name in enumerate(COUNTERS)}
        return out | {name: summed.histogram(name) for name in HISTOGRAMS}
