"""One process's batches: fetch -> decode -> collate, pipelined across batches, in order.

A :class:`BatchPipeline` keeps one :class:`~.slot.Slot` per batch in progress; a producer
chosen once by the dataset makes the samples (:mod:`.remote`, :mod:`.produce`). Invariants:

- batch ``b`` holds exactly the samples of ``batches[b]``, in order, each once;
- at least ``prefetch_batches`` batches in progress while there are more; more only while
  the producer asks for them (:meth:`~.produce.GetItems.wants_more`: a self-tuned fetch
  limit with free slots); a batch is taken from ``batches`` only when it starts (a worker
  claims no more than it started);
- a batch's first failure fails it, raised when the consumer reaches it;
- a stall (``LoaderStalled``) is the outcome of every batch in progress; none starts after;
- :meth:`close` cancels work, joins the threads and returns the runtime lease; idempotent.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Generator, Iterable, Iterator, Sequence
from typing import Any

from torch.utils.data import Dataset, get_worker_info

from ..errors import LoaderStalled
from ..metrics import StageStats
from ..sources import SampleSource
from .options import PipelineOptions, StallWatch
from .produce import GetItems, LocalReads
from .remote import RemoteReads
from .slot import Failure, Slot

__all__ = ["BatchPipeline", "source_of"]


def source_of(dataset: Dataset[Any]) -> SampleSource | None:
    source = getattr(dataset, "source", None)
    return source if isinstance(source, SampleSource) else None


class BatchPipeline:
    """Yields ``collate([dataset[i] for i in batch])`` for each batch of ``batches``, in order."""

    def __init__(
        self,
        dataset: Dataset[Any],
        batches: Iterable[Sequence[Any]],
        *,
        collate_fn: Callable[[list[Any]], Any],
        options: PipelineOptions,
        stats: StageStats | None = None,
        publish: Callable[[StageStats], None] | None = None,
    ) -> None:
        self._publish = publish
        self._batches = iter(batches)
        self.broken: BaseException | None = None
        self._collate = collate_fn
        self._prefetch = options.prefetch_batches
        self._follow_limit = options.follow_limit
        self._slots: dict[int, Slot] = {}
        self._next_to_start = 0
        self._closed = False
        self._stalled = False
        self.stats = stats if stats is not None else StageStats()
        info = get_worker_info()
        watch = self._watch = StallWatch(
            options.stall_timeout_s,
            where=f"loader worker {info.id}" if info is not None else "the loader",
        )
        self._producer = _producer(dataset, options, self.stats, watch)
        watch.describe = self._describe  # (while the producer opened, nothing was in progress)

    def __iter__(self) -> Iterator[Any]:
        with contextlib.closing(self.outcomes()) as outcomes:  # closed before raising
            for outcome in outcomes:
                if isinstance(outcome, Failure):
                    raise outcome.exc
                yield outcome

    def outcomes(self) -> Generator[Any, None, None]:
        """One outcome per batch started, in order: the batch, or :class:`Failure`; after a
        stall, :attr:`broken` holds it. Closes the pipeline when done."""
        try:
            self._top_up()
            b = 0
            while b in self._slots:
                slot = self._slots.pop(b)
                b += 1
                try:
                    self._watch.wait(slot.future, f"batch {b - 1} of its share")
                except LoaderStalled as stalled:
                    self._stalled = True
                    self.broken = stalled
                    in_progress = len(self._slots)
                    self.close()
                    for _ in range(1 + in_progress):
                        yield Failure(stalled)
                    return
                self._top_up()
                try:
                    outcome = slot.collated()
                except Exception as exc:
                    outcome = Failure(exc)
                self._flush_stats()
                yield outcome
        finally:
            self.close()

    def _describe(self) -> str:
        progress = f"{len(self._slots)} batches in progress"
        waits = self._producer.describe()
        return f"{progress}, {waits}" if waits else progress

    def _flush_stats(self) -> None:
        self._producer.flush_stats()
        if self._publish is not None:
            self._publish(self.stats)

    def _top_up(self) -> None:
        """Start batches up to ``prefetch_batches`` in progress, and beyond while the
        producer asks for more samples in progress."""
        while len(self._slots) < self._prefetch or (
            self._follow_limit
            and self._producer.wants_more(sum(len(s.indices) for s in self._slots.values()))
        ):
            if not self._start_next():
                return

    def _start_next(self) -> bool:
        if self._closed:
            return False
        indices = next(self._batches, None)
        if indices is None:
            return False
        slot = self._slots[self._next_to_start] = Slot(indices, self._collate, self._next_to_start)
        self._next_to_start += 1
        self._producer.start(slot)
        return True

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._flush_stats()
        try:
            # After a stall a pool thread may be stuck in user code for good: joining it
            # would turn a clear error into the very hang it reports.
            self._producer.close(stalled=self._stalled)
        finally:
            self._slots.clear()


def _producer(
    dataset: Dataset[Any], options: PipelineOptions, stats: StageStats, watch: StallWatch
) -> GetItems:
    source = source_of(dataset)
    if source is None:
        return GetItems(dataset, options, stats)
    if source.store.capabilities.remote:
        return RemoteReads(dataset, source, options, stats, watch)
    store = source.store.open(source.fetch_config)
    return LocalReads(dataset, source, store, options, stats)  # type: ignore[arg-type]
