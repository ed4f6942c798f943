"""Measuring data stalls: how much of a training loop's time is spent waiting for batches.

:class:`StallMeter` splits each step into *wait* (``next()``) and *compute* (until the next
``next()``), synchronising a CUDA device at step boundaries only, so queued kernels count as
compute; a recorded step's ``wait_s + compute_s`` is the wall time between two requests,
and a step cut short by ``break`` or an exception is not recorded. :func:`measure_stalls`
also replays one batch from memory (DS-Analyzer's differential method) and reports the
loader-fed rate as a fraction of that loading-free rate.
"""

from __future__ import annotations

import functools
import itertools
import math
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

import torch

from ..config import check_count
from ..errors import ConfigError
from ..metrics import StallLedger
from .tree import first_tensor

__all__ = ["StallComparison", "StallMeter", "StallReport", "measure_stalls", "repeat_batch"]

T = TypeVar("T")


@dataclass(frozen=True)
class StallReport:
    """Totals and percentiles over the recorded steps of one run."""

    steps: int
    samples: int
    wait_s: float
    compute_s: float
    step_p50_s: float
    step_p95_s: float

    @property
    def total_s(self) -> float:
        return self.wait_s + self.compute_s

    @property
    def stall_share(self) -> float:
        """Share of the loop's time spent waiting for data: ``wait / (wait + compute)``."""
        return self.wait_s / self.total_s if self.total_s > 0 else math.nan

    @property
    def samples_per_s(self) -> float:
        return self.samples / self.total_s if self.total_s > 0 else math.nan

    @property
    def mean_wait_s(self) -> float:
        return self.wait_s / self.steps if self.steps else math.nan

    @property
    def mean_compute_s(self) -> float:
        return self.compute_s / self.steps if self.steps else math.nan

    def __str__(self) -> str:
        return (
            f"{self.steps} steps, {self.samples_per_s:.1f} samples/s; step p50 "
            f"{self.step_p50_s * 1e3:.1f} ms, p95 {self.step_p95_s * 1e3:.1f} ms; per step "
            f"wait {self.mean_wait_s * 1e3:.1f} ms + compute {self.mean_compute_s * 1e3:.1f} ms; "
            f"data stall {self.stall_share:.1%}"
        )


@dataclass(frozen=True)
class StallComparison:
    """A loader-fed run next to the same steps fed from memory (the differential method)."""

    loader: StallReport
    synthetic: StallReport

    @property
    def rate_ratio(self) -> float:
        """Loader-fed samples/s over synthetic samples/s; 1.0 means loading costs nothing."""
        if not self.synthetic.samples_per_s > 0:
            return math.nan
        return self.loader.samples_per_s / self.synthetic.samples_per_s

    def __str__(self) -> str:
        # 1 - rate_ratio is the share of the loader-fed run lost to data (noise can make it
        # slightly negative).
        return (
            f"loader-fed: {self.loader}\n"
            f"synthetic:  {self.synthetic}\n"
            f"loader-fed rate / synthetic rate: {self.rate_ratio:.3f} "
            f"(differential data stall {1.0 - self.rate_ratio:.1%})"
        )


class StallMeter:
    """Times the steps of a loop over :meth:`iterate`; read the result with :meth:`report`.

    Args:
        device: the device the steps compute on (a CUDA one is synchronised at step
            boundaries).
        warmup_steps: leading steps timed but not reported (worker start-up, autotuning).
        samples_per_batch: counts the samples in a batch; by default the first dimension
            of the batch's first tensor.
        clock: seconds, monotonic.
    """

    def __init__(
        self,
        *,
        device: str | torch.device | None = None,
        warmup_steps: int = 0,
        samples_per_batch: Callable[[Any], int] | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        check_count("warmup_steps", warmup_steps, 0)
        self.warmup_steps = warmup_steps
        resolved = torch.device(device if device is not None else "cpu")
        self._synchronize: Callable[[], None] = lambda: None
        if resolved.type == "cuda" and torch.cuda.is_available():
            self._synchronize = functools.partial(torch.cuda.synchronize, resolved)
        self._samples_per_batch = samples_per_batch or _default_samples
        self._clock = clock
        self._ledger = StallLedger()

    def iterate(self, batches: Iterable[T], *, max_steps: int | None = None) -> Iterator[T]:
        """Yield from ``batches`` (at most ``max_steps``), timing each step; an iterator made
        here is closed when the loop ends, one passed in is left open."""
        iterator = iter(batches)
        owned = iterator is not batches
        try:
            self._synchronize()
            steps = 0
            while max_steps is None or steps < max_steps:
                asked = self._clock()
                try:
                    batch = next(iterator)
                except StopIteration:
                    return
                got = self._clock()
                samples = self._samples_per_batch(batch)
                yield batch
                del batch
                self._synchronize()
                warmup = self._ledger.warmup_steps < self.warmup_steps
                self._ledger.record(got - asked, self._clock() - got, samples, warmup=warmup)
                steps += 1
        finally:
            close = getattr(iterator, "close", None)
            if owned and callable(close):
                close()

    def report(self) -> StallReport:
        """The steps recorded so far, warm-up left out."""
        ledger = self._ledger
        return StallReport(
            steps=ledger.steps,
            samples=ledger.samples,
            wait_s=ledger.wait_s,
            compute_s=ledger.compute_s,
            step_p50_s=_or_nan(ledger.step_percentile(50)),
            step_p95_s=_or_nan(ledger.step_percentile(95)),
        )


def repeat_batch(batch: T, times: int) -> Iterator[T]:
    """``batch`` ``times`` times: a loading-free source for the same training step."""
    return itertools.repeat(batch, times)


def measure_stalls(
    train_step: Callable[[Any], object],
    batches: Iterable[Any],
    *,
    steps: int,
    warmup_steps: int = 2,
    device: str | torch.device | None = None,
    samples_per_batch: Callable[[Any], int] | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> StallComparison:
    """Run ``train_step`` for ``warmup_steps + steps`` steps fed by ``batches``, then as many
    on its first batch replayed from memory; compare the two (warm-up left out of each)."""
    check_count("steps", steps)
    total = warmup_steps + steps

    meter = functools.partial(
        StallMeter,
        device=device,
        warmup_steps=warmup_steps,
        samples_per_batch=samples_per_batch,
        clock=clock,
    )

    fed = meter()
    ran = 0
    for ran, batch in enumerate(fed.iterate(batches, max_steps=total), 1):
        if ran == 1:
            first = batch
        train_step(batch)
    if not ran:
        raise ConfigError("measure_stalls: batches yielded no batch")
    synthetic = meter()
    for batch in synthetic.iterate(repeat_batch(first, ran)):
        train_step(batch)
    return StallComparison(loader=fed.report(), synthetic=synthetic.report())


def _default_samples(batch: Any) -> int:
    tensor = first_tensor(batch)
    if tensor is None or tensor.ndim == 0:
        return 1
    return int(tensor.shape[0])


def _or_nan(value: float | None) -> float:
    return math.nan if value is None else value
