"""The per-process batch pipeline: fetch -> decode -> collate, pipelined across batches.

One :class:`BatchPipeline` runs in each process that produces batches (each DataLoader
worker, or the main process when ``num_workers=0``). It is given this process's share of
the epoch's batches, in sampler order, and yields them collated, in that order.

How work flows, for a dataset of ours over a remote store::

    consumer thread           event loop thread (runtime)         decode threads
    ---------------           ---------------------------         --------------
    start batch b+p   --->    one task per sample: GET     --->   decode, put in slot;
    wait for batch b  <---------------------------------------   last one completes it
    collate batch b

Guarantees:

- Batch ``b`` holds exactly the samples of ``batches[b]``, in order, whatever order the GETs
  and decodes complete in; every sample is delivered exactly once.
- At most ``prefetch_batches`` batches are in progress (started and not yet taken by the
  consumer); within them at most ``max_inflight_requests`` GETs are in flight (the reader's
  adaptive limit, lowered under throttling), and a GET is sent only when the bytes held
  (fetched, not yet decoded) plus those expected of the GETs in flight (the mean object size
  so far; before the first object arrives, one GET at a time) fit in ``max_inflight_bytes``.
  One object larger than the mean may overshoot it; one GET is always allowed, so a single
  object larger than the budget still loads.
- The next batches' GETs are in flight while the current batch decodes: no per-batch barrier.
- The first failure of a batch fails that batch at once; it is raised when the consumer
  reaches the batch, so every earlier batch is still delivered. With ``on_error="skip"`` a
  sample failing with a :class:`~concurrent_loader.errors.LoaderError` is left out instead
  and the batch is yielded as :class:`Partial` (the batch of the others, and what was
  skipped), which the loader marks for the caller; other exceptions (bugs) always fail.
- :meth:`close` (also on ``break``, exceptions and garbage collection of the generator)
  cancels outstanding GETs, joins the decode threads and returns the runtime lease.

Local datasets skip the event loop: reading and decoding happen in one thread-pool job.
Datasets that are not ours have their ``__getitem__`` called on a thread pool of
``max_inflight_requests`` threads, pipelined the same way.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import dataclasses
import functools
import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from torch.utils.data import Dataset

from .dataset import ObjectDataset
from .errors import LoaderError
from .fetch import Reader
from .runtime import Runtime, acquire_runtime
from .stats import StageStats

__all__ = ["BatchPipeline", "Partial", "SkippedSample"]

log = logging.getLogger(__name__)

_SKIPPED = object()


@dataclass(frozen=True)
class SkippedSample:
    """A sample left out under ``on_error="skip"``: its dataset index, object and error."""

    index: int
    url: str
    error: LoaderError


@dataclass(frozen=True)
class Partial:
    """A batch that lost samples: ``batch`` (None when every sample failed) and ``skipped``."""

    batch: Any
    skipped: list[SkippedSample]


class _Slot:
    """One batch being assembled; items land by position from any thread."""

    __slots__ = ("collate", "future", "indices", "items", "lock", "remaining", "skipped")

    skipped: list[tuple[int, SkippedSample]]

    def __init__(self, indices: Sequence[int], collate: Callable[[list[Any]], Any]) -> None:
        self.indices = indices
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
            self.items[position] = _SKIPPED
            self.skipped.append((position, sample))
            self.remaining -= 1
            if self.remaining:
                return
        self._finish()

    def _finish(self) -> None:
        self.future.set_result([item for item in self.items if item is not _SKIPPED])
        self.items = []

    def collated(self) -> Any:
        """The batch, collated in the calling (consumer) thread.

        Not on a decode thread: torch ops called from a new thread start their own OpenMP
        team, which spins against the decode threads (measured: 3.5x the CPU per image).
        """
        items = self.future.result()
        try:
            batch = self.collate(items) if items else None
        except BaseException as exc:
            exc.add_note("while collating a batch")
            raise
        if self.skipped:
            return Partial(batch, [s for _, s in sorted(self.skipped)])
        return batch

    def fail(self, exc: BaseException) -> None:
        with self.lock:
            if self.future.done():
                return
            self.future.set_exception(exc)
        self.items = []


class BatchPipeline:
    """Yields ``collate([dataset[i] for i in batch])`` for each batch of ``batches``, in order."""

    def __init__(
        self,
        dataset: Dataset[Any],
        batches: Sequence[Sequence[int]],
        *,
        collate_fn: Callable[[list[Any]], Any],
        max_inflight_requests: int | None = None,
        max_inflight_bytes: int | None = None,
        decode_threads: int = 1,
        prefetch_batches: int = 2,
        on_error: str = "raise",
        stats: StageStats | None = None,
        publish: Callable[[StageStats], None] | None = None,
    ) -> None:
        if on_error not in ("raise", "skip"):
            raise ValueError(f"on_error must be 'raise' or 'skip', got {on_error!r}")
        self._skip = on_error == "skip"
        self._publish = publish
        self._dataset = dataset
        self._batches = batches
        self._collate = collate_fn
        self._prefetch = max(1, prefetch_batches)
        self._slots: dict[int, _Slot] = {}
        self._next_to_start = 0
        self._closed = False
        self.stats = stats if stats is not None else StageStats()
        self._runtime: Runtime | None = None
        self._reader: Reader | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        if isinstance(dataset, ObjectDataset):
            config = dataset.fetch_config
            if max_inflight_requests is not None:
                config = dataclasses.replace(config, max_inflight_requests=max_inflight_requests)
            if dataset.location.is_local:
                self._mode = "local"
                self._reader = dataset.open_reader_blocking()
            else:
                self._mode = "remote"
                self._runtime = acquire_runtime()
                try:
                    self._reader = self._runtime.run(
                        self._runtime.resource(
                            dataset.reader_key(config),
                            functools.partial(dataset.open_reader, config),
                        )
                    )
                except BaseException:
                    self._runtime.release()
                    raise
            threads = decode_threads
        else:
            self._mode = "generic"
            threads = max_inflight_requests or 64
        self._max_bytes = max_inflight_bytes or (
            dataset.fetch_config.max_inflight_bytes if isinstance(dataset, ObjectDataset) else 0
        )
        self._seen_retries = self._reader.retries if self._reader is not None else 0
        self._seen_throttles = self._reader.limit.throttles if self._reader is not None else 0
        self._held_bytes = 0  # fetched bodies not yet decoded (decode threads release them)
        self._reserved_bytes = 0  # expected bodies of the GETs in flight (loop thread only)
        self._sizes = [0, 0]  # total bytes and count of objects fetched, for the mean
        self._bytes_lock = threading.Lock()
        self._bytes_waiters: collections.deque[asyncio.Future[None]] = collections.deque()
        self._pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=max(1, threads), thread_name_prefix=f"concurrent-loader-{self._mode}"
        )

    # ------------------------------------------------------------------ consumer side

    def __iter__(self) -> Iterator[Any]:
        try:
            for _ in range(min(self._prefetch, len(self._batches))):
                self._start_next()
            for b in range(len(self._batches)):
                slot = self._slots.pop(b)
                slot.future.exception()  # wait for the batch (its error is raised below)
                if self._next_to_start < len(self._batches):
                    self._start_next()
                batch = slot.collated()
                self._flush_stats()
                yield batch
        finally:
            self.close()

    def _flush_stats(self) -> None:
        reader = self._reader
        if reader is not None:
            self.stats.add("retries", reader.retries - self._seen_retries)
            self.stats.add("throttles", reader.limit.throttles - self._seen_throttles)
            self.stats.set("inflight", reader.limit.in_flight)
            self._seen_retries, self._seen_throttles = reader.retries, reader.limit.throttles
        if self._publish is not None:
            self._publish(self.stats)

    def _start_next(self) -> None:
        b = self._next_to_start
        self._next_to_start += 1
        slot = _Slot(self._batches[b], self._collate)
        self._slots[b] = slot
        if self._mode == "remote":
            assert self._runtime is not None
            self._runtime.call_soon(self._start_fetches, slot)
        elif self._mode == "local":
            for position, index in enumerate(slot.indices):
                self._pool.submit(self._read_and_decode, slot, position, index)
        else:
            for position, index in enumerate(slot.indices):
                self._pool.submit(self._getitem, slot, position, index)

    # ------------------------------------------------------------------ workers

    def _start_fetches(self, slot: _Slot) -> None:
        """On the loop: one task per sample, created in sampler order."""
        if self._closed:
            return
        loop = asyncio.get_running_loop()
        for position, index in enumerate(slot.indices):
            task = loop.create_task(self._fetch(slot, position, index))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _fetch(self, slot: _Slot, position: int, index: int) -> None:
        if slot.failed:
            return
        expected = await self._reserve_bytes()
        dataset: ObjectDataset = self._dataset  # type: ignore[assignment]
        reader = self._reader
        assert reader is not None
        try:
            data = await reader.get(dataset.key_of(index), on_response=self.stats.add_fetch)
        except asyncio.CancelledError:
            self._unreserve(expected)
            raise
        except BaseException as exc:
            self._unreserve(expected)
            self._failed(slot, position, index, exc)
            return
        size = len(data)
        self._sizes[0] += size
        self._sizes[1] += 1
        with self._bytes_lock:
            self._held_bytes += size
        self._unreserve(expected)
        try:
            self._pool.submit(self._decode, slot, position, index, data)
        except RuntimeError:  # the pool is shut down: we are closing
            self._release_bytes(size)

    def _decode(self, slot: _Slot, position: int, index: int, data: bytes | bytearray) -> None:
        try:
            if slot.failed:
                return
            started = time.perf_counter()
            item = self._dataset.decode_sample(index, data)  # type: ignore[attr-defined]
            self.stats.add_decode(time.perf_counter() - started)
        except BaseException as exc:
            self._failed(slot, position, index, exc)
        else:
            slot.put(position, item)
        finally:
            self._release_bytes(len(data))

    def _read_and_decode(self, slot: _Slot, position: int, index: int) -> None:
        if slot.failed:
            return
        dataset: ObjectDataset = self._dataset  # type: ignore[assignment]
        reader = self._reader
        assert reader is not None
        try:
            started = time.perf_counter()
            data = reader.read_blocking(dataset.key_of(index))
            fetched = time.perf_counter()
            self.stats.add_fetch(fetched - started, len(data))
            item = dataset.decode_sample(index, data)
            self.stats.add_decode(time.perf_counter() - fetched)
        except BaseException as exc:
            self._failed(slot, position, index, exc)
        else:
            slot.put(position, item)

    def _getitem(self, slot: _Slot, position: int, index: int) -> None:
        if slot.failed:
            return
        try:
            started = time.perf_counter()
            item = self._dataset[index]
            self.stats.add_decode(time.perf_counter() - started)
        except BaseException as exc:
            self._failed(slot, position, index, exc)
        else:
            slot.put(position, item)

    def _failed(self, slot: _Slot, position: int, index: int, exc: BaseException) -> None:
        """Sample ``index`` failed: skip it (policy "skip", our errors only) or fail its batch."""
        dataset = self._dataset
        if self._skip and isinstance(exc, LoaderError):
            url = exc.url or (
                dataset.url_for(index) if isinstance(dataset, ObjectDataset) else f"item {index}"
            )
            self.stats.add("skipped")
            slot.skip(position, SkippedSample(index, url, exc))
            return
        if not isinstance(exc, LoaderError):
            # Errors from user code (a transform, a foreign dataset) get the object's name.
            where = (
                dataset.url_for(index) if isinstance(dataset, ObjectDataset) else f"item {index!r}"
            )
            exc.add_note(f"while loading {where} of {type(dataset).__name__}")
        slot.fail(exc)

    # ------------------------------------------------------------------ byte budget

    def _expected_size(self) -> int:
        total, count = self._sizes
        return total // count if count else self._max_bytes

    def _fits(self, expected: int) -> bool:
        committed = self._held_bytes + self._reserved_bytes
        return committed == 0 or committed + expected <= self._max_bytes

    async def _reserve_bytes(self) -> int:
        """Wait, in FIFO order, until one more GET's expected body fits; reserve it."""
        expected = self._expected_size()
        with self._bytes_lock:
            # Checked and queued under the lock that decode threads release bytes under, so
            # a release cannot slip between the check and the queueing unnoticed.
            if not self._bytes_waiters and self._fits(expected):
                self._reserved_bytes += expected
                return expected
            waiter = asyncio.get_running_loop().create_future()
            self._bytes_waiters.append(waiter)
        try:
            while True:
                await waiter
                expected = self._expected_size()
                with self._bytes_lock:
                    if self._fits(expected):
                        self._reserved_bytes += expected
                        break
                    waiter = asyncio.get_running_loop().create_future()
                    self._bytes_waiters.appendleft(waiter)  # keep its place in line
        except asyncio.CancelledError:
            with self._bytes_lock:
                if waiter in self._bytes_waiters:
                    self._bytes_waiters.remove(waiter)
            if waiter.done() and not waiter.cancelled():
                self._wake_next()  # pass on the turn we were given
            raise
        self._wake_next()  # the next in line may fit too
        return expected

    def _unreserve(self, expected: int) -> None:
        with self._bytes_lock:
            self._reserved_bytes -= expected
        self._wake_next()

    def _release_bytes(self, size: int) -> None:
        """From decode threads: the body is decoded, its bytes are free."""
        with self._bytes_lock:
            self._held_bytes -= size
            wake = bool(self._bytes_waiters)
        if wake and self._runtime is not None and not self._closed:
            self._runtime.call_soon(self._wake_next)

    def _wake_next(self) -> None:
        with self._bytes_lock:
            waiter = self._bytes_waiters.popleft() if self._bytes_waiters else None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _wake_all(self) -> None:
        with self._bytes_lock:
            waiters, self._bytes_waiters = self._bytes_waiters, collections.deque()
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    # ------------------------------------------------------------------ shutdown

    def close(self) -> None:
        """Cancel outstanding work, join the threads, return the runtime lease. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._flush_stats()
        runtime, self._runtime = self._runtime, None
        try:
            # At interpreter exit the runtime may already be closed (its tasks cancelled).
            if runtime is not None and not runtime.closed:
                runtime.run(self._cancel_tasks())
            self._pool.shutdown(wait=True, cancel_futures=True)
        finally:
            if runtime is not None:
                runtime.release()
            self._slots.clear()

    async def _cancel_tasks(self) -> None:
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        self._wake_all()
