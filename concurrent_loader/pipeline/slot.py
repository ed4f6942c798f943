"""One batch being assembled from samples that complete in any order, on any thread."""

from __future__ import annotations

import concurrent.futures
import contextlib
import heapq
import itertools
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import LoaderError
from .threads import ThreadController

__all__ = ["DecodeQueue", "Failure", "Partial", "SkippedSample", "Slot"]

_SKIPPED = object()


@dataclass(frozen=True)
class SkippedSample:
    """A sample left out under ``on_error="skip"``: its dataset index, object and error."""

    index: Any
    url: str
    error: LoaderError


@dataclass(frozen=True)
class Partial:
    """A batch that lost samples: ``batch`` (None when every sample failed) and ``skipped``."""

    batch: Any
    skipped: list[SkippedSample]


@dataclass(frozen=True, slots=True)
class Failure:
    """A batch that failed: the exception, carried as data (also from a worker process to the
    main one, where it is raised with its type and attributes intact)."""

    exc: BaseException


class Slot:
    """Items land by position from any thread; the last one (or the first failure) completes
    ``future``. After completion, later puts, skips and failures are ignored."""

    __slots__ = ("collate", "future", "indices", "items", "lock", "number", "remaining", "skipped")

    skipped: list[tuple[int, SkippedSample]]

    def __init__(
        self, indices: Sequence[Any], collate: Callable[[list[Any]], Any], number: int = 0
    ) -> None:
        self.indices = indices
        #: the batch's place in its pipeline's order (0: the first batch started)
        self.number = number
        self.items: list[Any] = [None] * len(indices)
        self.remaining = len(indices)
        self.skipped = []
        self.lock = threading.Lock()
        self.collate = collate
        self.future: concurrent.futures.Future[Any] = concurrent.futures.Future()

    @property
    def failed(self) -> bool:
        return self.future.done()

    def put(self, position: int, item: Any) -> None:
        with self.lock:
            if self.future.done():
                return
            self.items[position] = item
            self.remaining -= 1
            if self.remaining:
                return
        self._finish()

    def skip(self, position: int, sample: SkippedSample) -> None:
        with self.lock:
            if self.future.done():
                return
            self.skipped.append((position, sample))
        self.put(position, _SKIPPED)  # the batch cannot complete before this put

    def _finish(self) -> None:
        self.future.set_result([item for item in self.items if item is not _SKIPPED])
        self.items = []

    def fail(self, exc: BaseException) -> None:
        with self.lock:
            if self.future.done():
                return
            self.future.set_exception(exc)
        self.items = []

    def collated(self) -> Any:
        # Collated in the consumer thread: torch ops on a new thread start their own OpenMP
        # team, which spins against the decode threads (3.5x the CPU per image).
        items = self.future.result()
        try:
            batch = self.collate(items) if items else None
        except BaseException as exc:
            exc.add_note("while collating a batch")
            raise
        if self.skipped:
            return Partial(batch, [s for _, s in sorted(self.skipped)])
        return batch


class DecodeQueue:
    """Fetched samples waiting for a decode thread, taken earliest batch first (then by
    position), so the batch the consumer waits for is not decoded behind later ones.

    A pool job drains the queue; a put starts a job only while fewer than ``max_jobs`` run.
    With a ``tuner`` (:class:`~.threads.ThreadController`), ``max_jobs`` is what it decides
    as jobs end (a decode that returns False did no work and is not reported): a job beyond
    it ends after its sample, one below it starts while samples wait. Invariant, under the
    lock: ``running <= max_jobs`` but for jobs about to end, and a non-empty queue has a
    running job that will take from it. A job gives way between samples while the process
    forks.
    """

    def __init__(
        self,
        submit: Callable[[Callable[[], bool | None]], object],
        max_jobs: int,
        yield_to_fork: Callable[[], bool] = lambda: False,
        tuner: ThreadController | None = None,
    ) -> None:
        self._heap: list[tuple[int, int, int, int, Callable[[], bool | None]]] = []
        self._lock = threading.Lock()
        self._order = itertools.count()
        self._submit = submit
        self.max_jobs = tuner.threads if tuner is not None else max_jobs
        self._yield_to_fork = yield_to_fork
        self._tuner = tuner
        self.running = 0

    def __len__(self) -> int:
        """Samples waiting for a decode thread (read without the lock: a moment's count)."""
        return len(self._heap)

    def put(self, slot: Slot, position: int, size: int, decode: Callable[[], bool | None]) -> None:
        with self._lock:
            heapq.heappush(self._heap, (slot.number, position, next(self._order), size, decode))
            if self.running >= self.max_jobs:
                return
            self.running += 1
        self._start_job()

    def _start_job(self) -> None:
        """Submit a job counted in ``running`` already."""
        try:
            self._submit(self._drain)
        except BaseException:
            with self._lock:
                self.running -= 1
            raise

    def _drain(self) -> None:
        try:
            while True:
                with self._lock:
                    if not self._heap or self.running > self.max_jobs:
                        self.running -= 1
                        return
                    if self._yield_to_fork():
                        break
                    decode = heapq.heappop(self._heap)[-1]
                    waited = bool(self._heap)
                if self._tuner is None:
                    decode()
                    continue
                started = time.perf_counter()
                if decode() is not False:  # False: no work (its batch had failed)
                    self._tuned(self._tuner, time.perf_counter() - started, waited)
        except BaseException:
            self._hand_on()  # the samples behind the one that raised are still decoded
            raise
        self._hand_on()  # a fork waits for this job to end

    def _tuned(self, tuner: ThreadController, seconds: float, waited: bool) -> None:
        with self._lock:
            self.max_jobs = tuner.observe(seconds, waited)
            grow = self.running < self.max_jobs and bool(self._heap)
            if grow:
                self.running += 1
        if grow:
            with contextlib.suppress(RuntimeError):  # the pool is shut down: we are closing
                self._start_job()

    def _hand_on(self) -> None:
        # Samples may be left: a new job (waiting at the pool's gate while the process
        # forks) takes over the queue, keeping the count of jobs.
        try:
            self._submit(self._drain)
        except RuntimeError:  # the pool is shut down: we are closing
            with self._lock:
                self.running -= 1

    def drop_all(self) -> int:
        """Forget every sample waiting; their bytes in all."""
        with self._lock:
            dropped, self._heap = self._heap, []
        return sum(entry[3] for entry in dropped)
