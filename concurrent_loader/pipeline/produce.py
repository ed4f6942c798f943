"""Producers that make a batch's samples on a thread pool: ``__getitem__`` (:class:`GetItems`)
and local reads (:class:`LocalReads`); :mod:`.remote` builds on them. Invariants:

- each sample is put, skipped or failed exactly once; a failed batch's samples are not made;
- an index that is not a plain int goes to ``dataset[index]`` as it is, as torch passes it;
- a failing sample is skipped (``on_error="skip"``, ``LoaderError`` only) or fails its
  batch; other errors (user code) get a note naming the object and the dataset's type;
- :meth:`GetItems.close` cancels jobs not started and joins the threads, except after a stall.
"""

from __future__ import annotations

import contextlib
import functools
import time
from typing import Any

from torch.utils.data import Dataset

from ..errors import LoaderError
from ..metrics import StageStats
from ..runtime import GatedThreadPool
from ..sources import SampleSource
from ..stores.base import BlockingStore
from .options import PipelineOptions
from .slot import DecodeQueue, SkippedSample, Slot
from .threads import ThreadController

__all__ = ["GetItems", "LocalReads", "is_position"]


def is_position(index: Any) -> bool:
    return type(index) is int


class GetItems:
    """Each sample is ``dataset[index]``, on ``threads`` threads (gated: a fork of this
    process, for another loader's workers, waits for the running jobs)."""

    def __init__(
        self,
        dataset: Dataset[Any],
        options: PipelineOptions,
        stats: StageStats,
        threads: int | None = None,
        name: str = "getitem",
    ) -> None:
        self.dataset = dataset
        self.stats = stats
        self._skip = options.on_error == "skip"
        self.threads = threads or options.getitem_threads
        self.pool = GatedThreadPool(self.threads, f"concurrent-loader-{name}")

    def start(self, slot: Slot) -> None:
        for position, index in enumerate(slot.indices):
            self.pool.submit(self.complete, slot, position, index)

    def produce(self, index: Any) -> Any:
        started = time.perf_counter()
        item = self.dataset[index]
        self.stats.add_decode(time.perf_counter() - started)
        return item

    def complete(self, slot: Slot, position: int, index: Any) -> bool:
        """Make the sample and put it (False: not made, its batch had failed)."""
        if slot.failed:
            return False
        try:
            item = self.produce(index)
        except BaseException as exc:
            self.failed(slot, position, index, exc)
        else:
            slot.put(position, item)
        return True

    def where(self, index: Any) -> str:
        return f"item {index!r}"

    def failed(self, slot: Slot, position: int, index: Any, exc: BaseException) -> None:
        where = self.where(index)
        if self._skip and isinstance(exc, LoaderError):
            self.stats.add("skipped")
            slot.skip(position, SkippedSample(index, exc.url or where, exc))
            return
        if not isinstance(exc, LoaderError):
            exc.add_note(f"while loading {where} of {type(self.dataset).__name__}")
        slot.fail(exc)

    def wants_more(self, samples_in_progress: int) -> bool:
        """Whether one more batch would keep more work busy than ``samples_in_progress``."""
        return False

    def describe(self) -> str:
        """What the producer waits for, for stall reports ("": nothing beyond its jobs)."""
        return ""

    def flush_stats(self) -> None:
        """Bring ``stats`` up to date before they are published."""

    def close(self, stalled: bool) -> None:
        self.pool.shutdown(wait=not stalled, cancel_futures=True)


class SourceSamples(GetItems):
    """The samples of ``source`` (a plain int index), decoded earliest batch first
    (:class:`~.slot.DecodeQueue`) on ``decode_threads`` threads, or on as many as a
    :class:`~.threads.ThreadController` decides, up to ``max_decode_threads``."""

    def __init__(
        self,
        dataset: Dataset[Any],
        source: SampleSource,
        options: PipelineOptions,
        stats: StageStats,
        name: str,
    ) -> None:
        most = options.max_decode_threads
        super().__init__(dataset, options, stats, most or options.decode_threads, name)
        self.source = source
        tuner = ThreadController(options.decode_threads, most) if most else None
        self.decodes = DecodeQueue(
            self.pool.submit, options.decode_threads, self.pool.forking, tuner
        )

    def where(self, index: Any) -> str:
        if is_position(index):
            with contextlib.suppress(Exception):  # an index out of range has no object
                return self.source.url_for(index)
        return super().where(index)

    def flush_stats(self) -> None:
        self.stats.set("decode_threads", self.decodes.max_jobs)

    def close(self, stalled: bool) -> None:
        self.decodes.drop_all()  # not decoded by the jobs the pool's shutdown waits for
        super().close(stalled)


class LocalReads(SourceSamples):
    """A local store's samples: read (``get_blocking``) and decoded in one pool job."""

    def __init__(
        self,
        dataset: Dataset[Any],
        source: SampleSource,
        store: BlockingStore,
        options: PipelineOptions,
        stats: StageStats,
    ) -> None:
        super().__init__(dataset, source, options, stats, "local")
        self.store = store

    def start(self, slot: Slot) -> None:
        for position, index in enumerate(slot.indices):
            job = functools.partial(self.complete, slot, position, index)
            self.decodes.put(slot, position, 0, job)

    def produce(self, index: Any) -> Any:
        if not is_position(index):
            return super().produce(index)
        started = time.perf_counter()
        bodies = [self.store.get_blocking(r.key, r.byte_range) for r in self.source.reads(index)]
        fetched = time.perf_counter()
        self.stats.add_fetch(fetched - started, sum(len(b) for b in bodies))
        item = self.source.decode(index, bodies)
        self.stats.add_decode(time.perf_counter() - fetched)
        return item
