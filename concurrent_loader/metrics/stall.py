"""The one stall ledger: a consumer loop's time split into waiting for batches and the rest.

Used by the loader's :meth:`~concurrent_loader.ConcurrentDataLoader.stats` (the training
loop's wait per batch, the verdict's waiting share) and by
:class:`~concurrent_loader.gpu.StallMeter` (wait vs compute per training step).

A step is recorded as ``(wait, compute)``: ``wait`` the time ``next()`` took to return the
batch, ``compute`` the time from then until the loop asked for the next one. Steps marked
as warm-up (a pipeline filling up at an epoch's start, autotuning) are counted apart, so
shares and percentiles describe the steady state.
"""

from __future__ import annotations

import threading

from .percentile import percentile

__all__ = ["StallLedger"]


class StallLedger:
    """Per-step waits and computes, warm-up steps kept apart. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.waits: list[float] = []
        self.computes: list[float] = []
        self.samples = 0
        self.warmup_steps = 0
        self.warmup_s = 0.0

    def record(
        self, wait: float, compute: float, samples: int = 0, *, warmup: bool = False
    ) -> None:
        """One step; a warm-up step only adds to ``warmup_steps`` and ``warmup_s``."""
        with self._lock:
            if warmup:
                self.warmup_steps += 1
                self.warmup_s += wait + compute
                return
            self.waits.append(wait)
            self.computes.append(compute)
            self.samples += samples

    def reset(self) -> None:
        with self._lock:
            self.waits, self.computes = [], []
            self.samples = self.warmup_steps = 0
            self.warmup_s = 0.0

    @property
    def steps(self) -> int:
        return len(self.waits)

    @property
    def wait_s(self) -> float:
        return sum(self.waits)

    @property
    def compute_s(self) -> float:
        return sum(self.computes)

    @property
    def wait_share(self) -> float:
        """The steady state's share of time spent waiting (0 before any step)."""
        total = self.wait_s + self.compute_s
        return self.wait_s / total if total > 0 else 0.0

    def wait_percentile(self, q: float) -> float | None:
        return percentile(self.waits, q)

    def step_percentile(self, q: float) -> float | None:
        return percentile([w + c for w, c in zip(self.waits, self.computes, strict=True)], q)
