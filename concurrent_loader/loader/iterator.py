"""One epoch of a :class:`~.dataloader.ConcurrentDataLoader`: what ``iter(loader)`` returns.

It takes the outcomes of the inner DataLoader one by one: a batch is returned; a
:class:`~concurrent_loader.pipeline.Failure` is raised with the worker's exception (its type
and attributes intact) and the iterator stays usable, so the next ``next()`` returns the
batch after the failed one, as a stock DataLoader does. A batch that lost samples under
``on_error="skip"`` is marked and logged; past ``max_skipped`` the epoch ends with
``SkipBudgetExceeded``. It also counts the batches the consumer received (the resume point)
and how long it waited for each.

A worker process that dies without raising (killed by the OS) ends the epoch with a
``WorkerError`` naming it: the batches it held are lost, and the others go with their
workers, which are reaped before the error is raised. A later ``iter(loader)`` starts new
workers.

Errors are raised from a frame that does not hold the iterator, so a caller that keeps the
error (a logging handler, ``pytest.raises``) does not keep the worker processes alive.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch

from ..metrics import format_stats
from ..pipeline import Failure, Partial
from . import state as resume
from .partial import mark, pin

if TYPE_CHECKING:
    from .dataloader import ConcurrentDataLoader
    from .processes import WorkerProcesses

__all__ = ["EpochIterator"]

log = logging.getLogger(__name__)


class _Raise:
    __slots__ = ("exc",)

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


class EpochIterator(Iterator[Any]):
    """The batches of one epoch, in the sampler's order (``in_order=True``)."""

    def __init__(
        self,
        loader: ConcurrentDataLoader[Any],
        batches: Iterator[Any],
        progress: resume.EpochProgress,
        workers: WorkerProcesses,
    ) -> None:
        self._loader = loader
        self._batches: Iterator[Any] | None = batches
        self._progress = progress
        self._workers = workers
        self._budget = loader._skip_budget(progress.samples)
        self._first_batch = progress.batches_taken
        self._returned: float | None = None  # when the last batch was handed to the loop
        self._last_log = time.monotonic()
        if progress.done:
            self._finish(done=True)

    def __iter__(self) -> EpochIterator:
        return self

    def __len__(self) -> int:
        return self._progress.num_batches

    def __next__(self) -> Any:
        try:
            outcome = self._advance()
        except RuntimeError as raised:  # torch's SIGCHLD handler raises wherever we are
            outcome = _Raise(raised)
        if isinstance(outcome, _Raise):
            failure = self._loader._worker_failure(outcome.exc, self._workers)
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
        loader, progress = self._loader, self._progress
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
                _drop_tracebacks(exc)
                return _Raise(exc)
            got = time.perf_counter()
            # The first batch of an epoch waits for the pipeline to fill: the verdict judges
            # the steady state.
            loader._waits.record(
                got - asked,
                asked - self._returned if self._returned is not None else 0.0,
                warmup=progress.batches_taken == self._first_batch,
            )
            progress.batches_taken += 1
            if isinstance(item, Failure):
                _drop_tracebacks(item.exc)
                return _Raise(item.exc)
            if isinstance(item, Partial):
                failure = loader._note_skipped(item, self._budget)
                if failure is not None:
                    self._finish(done=False)
                    return _Raise(failure)
                if item.batch is None:
                    continue  # every sample of it failed: counted and logged
                contents = item.batch
                if loader.pin_memory and torch.cuda.is_available():
                    # torch's pin thread passed this wrapper through unpinned.
                    contents = pin(contents)
                item = mark(contents, item.skipped)
            if loader.log_every_s is not None and (
                time.monotonic() - self._last_log >= loader.log_every_s
            ):
                self._last_log = time.monotonic()
                log.info("%s", format_stats(loader.stats()))
            self._returned = time.perf_counter()
            return item


def _drop_tracebacks(exc: BaseException | None) -> None:
    """The tracebacks of an error and of its causes hold the frames they passed through (the
    pipeline, torch's iterator and so the worker processes) alive for as long as the caller
    keeps the error."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        exc.__traceback__ = None
        if exc.__context__ is not None and exc.__context__ is not exc.__cause__:
            _drop_tracebacks(exc.__context__)
        exc = exc.__cause__
