"""One epoch of a ``ConcurrentDataLoader``: what ``iter(loader)`` returns.

- a failed batch raises the worker's exception intact; the next ``next()`` goes on, as torch;
- a batch that lost samples (``on_error="skip"``) is marked and logged; past
  ``max_skipped`` the epoch ends with ``SkipBudgetExceeded``;
- a worker killed without raising ends the epoch with a ``WorkerError`` naming it;
- errors are raised from a frame that does not hold the iterator, so a kept error does not
  keep the worker processes alive.

It also counts the batches received (the resume point) and each wait. A marked batch is the
collated batch itself, of a subclass of its type (:class:`PartialBatch` for tuples,
:class:`PartialList`, :class:`PartialDict`) or, for a tensor, the tensor with an attribute,
carrying ``.skipped``: what was left out and why.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch

from ..errors import ConfigError, Reason, SkipBudgetExceeded
from ..gpu.tree import map_batch
from ..metrics import StallLedger, format_stats
from ..pipeline import Failure, Partial, SkippedSample
from . import state as resume
from .processes import drop_tracebacks

__all__ = ["EpochIterator", "PartialBatch", "PartialDict", "PartialList", "Skips"]
__all__ += ["check_max_skipped", "is_partial"]

log = logging.getLogger(__name__)


class PartialBatch(tuple[Any, ...]):
    """A tuple batch that lost samples under ``on_error="skip"``; see ``.skipped``."""

    skipped: list[SkippedSample]


class PartialList(list[Any]):
    """A list batch that lost samples under ``on_error="skip"``; see ``.skipped``."""

    skipped: list[SkippedSample]


class PartialDict(dict[Any, Any]):
    """A dict batch that lost samples under ``on_error="skip"``; see ``.skipped``."""

    skipped: list[SkippedSample]


_MARKED: dict[type, type] = {tuple: PartialBatch, list: PartialList, dict: PartialDict}


def mark(batch: Any, skipped: list[SkippedSample]) -> Any:
    for kind, marked_kind in _MARKED.items():
        if isinstance(batch, kind):
            marked = marked_kind(batch)
            marked.skipped = skipped
            return marked
    if isinstance(batch, torch.Tensor):
        batch.skipped = skipped  # type: ignore[attr-defined]
        return batch
    raise TypeError(
        f"on_error='skip' needs batches that can be marked (tuple, list, dict or tensor), "
        f"got {type(batch).__name__}"
    )


def pin(batch: Any) -> Any:
    """``batch`` with its tensors in pinned memory (torch's pin thread passes ours through)."""
    return map_batch(batch, lambda _, leaf: leaf.pin_memory() if torch.is_tensor(leaf) else leaf)


def is_partial(batch: Any) -> bool:
    """True if ``batch`` lost samples under ``on_error="skip"`` (its ``.skipped`` says which)."""
    return bool(getattr(batch, "skipped", None))


def check_max_skipped(max_skipped: int | float) -> None:
    if isinstance(max_skipped, float) and not 0 <= max_skipped < 1:
        raise ConfigError(f"max_skipped as a fraction must be in [0, 1), got {max_skipped}")
    if isinstance(max_skipped, int) and max_skipped < 0:
        raise ConfigError(f"max_skipped must be >= 0, got {max_skipped}")


class Skips:
    """The samples an epoch skipped (``on_error="skip"``), within ``max_skipped`` (a count,
    or a fraction of the epoch's ``samples``)."""

    def __init__(self, on_error: str, max_skipped: int | float, samples: int) -> None:
        self.skipped: list[SkippedSample] = []
        self.max_skipped = max_skipped
        if on_error != "skip":
            self.budget = float("inf")
        elif isinstance(max_skipped, float):
            self.budget = max_skipped * samples
        else:
            self.budget = float(max_skipped)

    def note(self, batch: Partial) -> BaseException | None:
        for sample in batch.skipped:
            log.warning("skipped %s: %s", sample.url, sample.error)
        self.skipped.extend(batch.skipped)
        if len(self.skipped) <= self.budget:
            return None
        last = batch.skipped[-1]
        failure = SkipBudgetExceeded(
            f"{len(self.skipped)} samples skipped this epoch, more than "
            f"max_skipped={self.max_skipped!r} allows ({self.budget})",
            url=last.url,
            cause=Reason.SKIP_BUDGET_EXCEEDED,
        )
        failure.__cause__ = last.error
        return failure


class EpochIterator(Iterator[Any]):
    """The batches of one epoch; ``failure(exc)`` is the error to raise for ``exc`` (a
    ``WorkerError`` when a worker died), ``stats()`` what ``log_every_s`` logs."""

    def __init__(
        self,
        batches: Iterator[Any],
        progress: resume.EpochProgress,
        *,
        failure: Callable[[BaseException], BaseException],
        skips: Skips,
        waits: StallLedger,
        pin_memory: bool,
        log_every_s: float | None,
        stats: Callable[[], dict[str, Any]],
    ) -> None:
        self._batches: Iterator[Any] | None = batches
        self._progress = progress
        self._failure = failure
        self._skips = skips
        self._waits = waits
        self._pin = pin_memory and torch.cuda.is_available()
        self._log_every_s = log_every_s
        self._stats = stats
        self._first_batch = progress.batches_taken
        self._returned: float | None = None  # when the last batch was handed to the loop
        self._last_log = time.monotonic()
        if progress.done:
            self._finish(done=True)

    def __len__(self) -> int:
        return self._progress.num_batches

    def __next__(self) -> Any:
        try:
            outcome = self._advance()
        except RuntimeError as raised:  # torch's SIGCHLD handler raises wherever we are
            outcome = Failure(raised)
        if isinstance(outcome, Failure):  # to raise (a batch is never one)
            failure = self._failure(outcome.exc)
            if failure is not outcome.exc:  # a worker died: the others go before it is said
                self._finish(done=False)
            del self, outcome  # the traceback keeps this frame: not the workers with it
            raise failure
        return outcome

    def close(self) -> None:
        """End the epoch here: the inner iterator (and its workers, unless persistent) go."""
        self._batches = None

    def _finish(self, *, done: bool) -> None:
        self._progress.done = done
        self._batches = None

    def _advance(self) -> Any:
        progress = self._progress
        while True:
            batches = self._batches
            if batches is None:
                raise StopIteration
            asked = time.perf_counter()
            try:
                item = next(batches)
            except StopIteration:
                self._finish(done=True)
                raise
            except Exception as exc:
                # The frames in its traceback (and its causes') hold torch's iterator.
                drop_tracebacks(exc)
                return Failure(exc)
            got = time.perf_counter()
            # The first batch of an epoch waits for the pipeline to fill: the verdict judges
            # the steady state.
            self._waits.record(
                got - asked,
                asked - self._returned if self._returned is not None else 0.0,
                warmup=progress.batches_taken == self._first_batch,
            )
            progress.batches_taken += 1
            if isinstance(item, Failure):
                drop_tracebacks(item.exc)
                return item
            if isinstance(item, Partial):
                failure = self._skips.note(item)
                if failure is not None:
                    self._finish(done=False)
                    return Failure(failure)
                if item.batch is None:
                    continue  # every sample of it failed: counted and logged
                # torch's pin thread passed this wrapper through unpinned.
                contents = pin(item.batch) if self._pin else item.batch
                item = mark(contents, item.skipped)
            every = self._log_every_s
            if every is not None and time.monotonic() - self._last_log >= every:
                self._last_log = time.monotonic()
                log.info("%s", format_stats(self._stats()))
            self._returned = time.perf_counter()
            return item
