"""Per-stage counters and latency histograms, cheap to update and mergeable across processes.

A :class:`StageStats` lives in each process's pipeline; snapshots (plain dicts of numbers)
travel to the main process and are merged there. Latencies go into fixed log-scale
histograms (10 buckets per decade from 1 microsecond to 1000 s), so merging is adding
arrays and percentiles are exact to the bucket (about 26 % wide).
"""

from __future__ import annotations

import math
import threading
from typing import Any

__all__ = ["Histogram", "StageStats"]

_PER_DECADE = 10
_LOW = 1e-6
_BUCKETS = 9 * _PER_DECADE + 1


class Histogram:
    __slots__ = ("count", "counts", "total")

    def __init__(self) -> None:
        self.counts = [0] * _BUCKETS
        self.count = 0
        self.total = 0.0

    def add(self, seconds: float) -> None:
        if seconds <= _LOW:
            bucket = 0
        else:
            bucket = min(_BUCKETS - 1, int(math.log10(seconds / _LOW) * _PER_DECADE) + 1)
        self.counts[bucket] += 1
        self.count += 1
        self.total += seconds

    def merge(self, other: Histogram) -> None:
        for i, c in enumerate(other.counts):
            self.counts[i] += c
        self.count += other.count
        self.total += other.total

    def percentile(self, q: float) -> float | None:
        """Upper edge of the bucket holding the ``q``-th percentile (0-100), in seconds."""
        if not self.count:
            return None
        rank = max(1, math.ceil(self.count * q / 100))
        seen = 0
        for i, c in enumerate(self.counts):
            seen += c
            if seen >= rank:
                return _LOW * 10 ** (i / _PER_DECADE)
        return None  # pragma: no cover - unreachable

    def to_dict(self) -> dict[str, Any]:
        return {"counts": list(self.counts), "count": self.count, "total": self.total}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Histogram:
        h = cls()
        h.counts = list(data["counts"])
        h.count = data["count"]
        h.total = data["total"]
        return h


class StageStats:
    """What one process's pipeline did: fetches, bytes, decode time, consumer waits."""

    _HISTOGRAMS = ("fetch", "decode", "wait")
    _COUNTERS = ("objects", "bytes", "batches")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.histograms = {name: Histogram() for name in self._HISTOGRAMS}
        self.counters = dict.fromkeys(self._COUNTERS, 0)

    def add_fetch(self, seconds: float, size: int) -> None:
        with self._lock:
            self.histograms["fetch"].add(seconds)
            self.counters["objects"] += 1
            self.counters["bytes"] += size

    def add_decode(self, seconds: float) -> None:
        with self._lock:
            self.histograms["decode"].add(seconds)

    def add_wait(self, seconds: float) -> None:
        with self._lock:
            self.histograms["wait"].add(seconds)
            self.counters["batches"] += 1

    def __getstate__(self) -> dict[str, Any]:
        return self.snapshot()

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__()  # type: ignore[misc]
        self.merge_snapshot(state)

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return {
                "counters": dict(self.counters),
                "histograms": {k: h.to_dict() for k, h in self.histograms.items()},
            }

    def merge_snapshot(self, snapshot: dict[str, Any]) -> None:
        with self._lock:
            for name, value in snapshot["counters"].items():
                self.counters[name] = self.counters.get(name, 0) + value
            for name, data in snapshot["histograms"].items():
                self.histograms.setdefault(name, Histogram()).merge(Histogram.from_dict(data))
