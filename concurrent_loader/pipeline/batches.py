"""The per-process batch pipeline: fetch -> decode -> collate, pipelined across batches.

One :class:`BatchPipeline` runs in each process that produces batches (each DataLoader
worker, or the main process when ``num_workers=0``). It is given this process's share of
the epoch's batches, in sampler order (an iterable it takes batches from only as it starts
them), and yields them collated, in that order.

How work flows, for a dataset with a remote :class:`~concurrent_loader.sources.SampleSource`::

    consumer thread           event loop thread (runtime)          decode threads
    ---------------           ---------------------------          --------------
    start batch b+p   --->    per sample: reserve bytes, GET  --->  source.decode, put in
    wait for batch b  <----------------------------------------   slot; last completes it
    collate batch b

Guarantees:

- Batch ``b`` holds exactly the samples of ``batches[b]``, in order, whatever order the GETs
  and decodes complete in; every sample is delivered exactly once.
- At most ``prefetch_batches`` batches are in progress (started and not yet taken by the
  consumer); within them the fetch client keeps at most ``max_inflight_requests`` GETs in
  flight, and the :class:`~concurrent_loader.fetch.ByteBudget` keeps fetched-but-undecoded
  bytes (plus those expected of the GETs in flight) within ``max_inflight_bytes``.
- The next batches' GETs are in flight while the current batch decodes: no per-batch barrier.
- The first failure of a batch fails that batch at once; it is raised when the consumer
  reaches the batch, so every earlier batch is still delivered. :meth:`outcomes` yields it
  as a :class:`~.slot.Failure` instead and goes on with the next batches, as torch's
  DataLoader does after an error. With ``on_error="skip"`` a
  sample failing with a :class:`~concurrent_loader.errors.LoaderError` is left out instead
  and the batch is yielded as :class:`~.slot.Partial`; other exceptions (bugs) always fail.
- :meth:`close` (also on ``break``, exceptions and garbage collection of the generator)
  cancels outstanding GETs, joins the threads and returns the runtime lease.

Local stores skip the event loop: reading and decoding happen in one thread-pool job.
Datasets without a source have their ``__getitem__`` called on ``getitem_threads`` threads,
pipelined the same way.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import functools
import logging
import time
from collections.abc import Callable, Generator, Iterable, Iterator, Sequence
from typing import Any

from torch.utils.data import Dataset, get_worker_info

from ..errors import LoaderError, LoaderStalled
from ..fetch import ByteBudget, FetchClient, client_for
from ..fetch.parts import read_in_parts
from ..metrics import StageStats
from ..runtime import CLOSE_TIMEOUT_S, GatedThreadPool, Runtime, acquire_runtime
from ..sources import Read, SampleSource
from ..sources.base import CoalescingSource
from ..sources.coalesce import MergedRead, plan_reads
from ..stores.base import BlockingStore
from .options import PipelineOptions
from .slot import DecodeQueue, Failure, SkippedSample, Slot
from .stall import StallWatch

__all__ = ["BatchPipeline", "source_of"]

log = logging.getLogger(__name__)

Bodies = list[bytes | bytearray]


def _is_position(index: Any) -> bool:
    """True for a plain int index, which a source reads; any other index (a dict key, a list
    for a bulk ``__getitem__``) goes to ``dataset[index]`` as it is, as torch passes it."""
    return type(index) is int


def source_of(dataset: Dataset[Any]) -> SampleSource | None:
    """The dataset's sample source, when it has one (our datasets do)."""
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
        self._skip = options.on_error == "skip"
        self._publish = publish
        self._dataset = dataset
        self._source = source_of(dataset)
        # Taken one at a time as batches start: a worker claiming batches claims no more than
        # it has started.
        self._batches = iter(batches)
        self.broken: BaseException | None = None
        self._collate = collate_fn
        self._prefetch = options.prefetch_batches
        self._parts = options.parts
        self._slots: dict[int, Slot] = {}
        self._next_to_start = 0
        self._closed = False
        self._stalled = False
        self.stats = stats if stats is not None else StageStats()
        self._runtime: Runtime | None = None
        self._client: FetchClient | None = None
        self._budget: ByteBudget | None = None
        self._blocking: BlockingStore | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        info = get_worker_info()
        self._watch = StallWatch(
            options.stall_timeout_s,
            where=f"loader worker {info.id}" if info is not None else "the loader",
            describe=self._describe,
        )
        source = self._source
        if source is None:
            self._mode = "getitem"
            threads = options.getitem_threads
        else:
            config = options.fetch_config(source.fetch_config)
            threads = options.decode_threads
            if not source.store.capabilities.remote:
                self._mode = "local"
                self._blocking = source.store.open(config)  # type: ignore[assignment]
            else:
                self._mode = "remote"
                runtime = self._runtime = acquire_runtime()
                try:
                    self._client = self._watch.result(
                        runtime.submit(client_for(runtime, source.store, config)),
                        "its fetch client to open",
                    )
                except BaseException:
                    runtime.release()
                    raise
                self._budget = ByteBudget(
                    options.max_inflight_bytes or config.max_inflight_bytes, runtime.call_soon
                )
        # Gated: a fork of this process (another loader's workers) waits for running jobs.
        self._pool = GatedThreadPool(threads, f"concurrent-loader-{self._mode}")
        self._decodes = DecodeQueue(self._pool.submit, threads, self._pool.forking)

    # ------------------------------------------------------------------ consumer side

    def __iter__(self) -> Iterator[Any]:
        """The batches; a failed batch raises (and ends the iteration) when reached."""
        outcomes = self.outcomes()
        try:
            for outcome in outcomes:
                if isinstance(outcome, Failure):
                    failure = outcome.exc
                    break
                yield outcome
            else:
                return
        finally:
            outcomes.close()
        raise failure

    def outcomes(self) -> Generator[Any, None, None]:
        """One outcome per batch started, in order: the batch, or :class:`Failure` for a batch
        that failed, after which the next batches follow as usual.

        A stall (``LoaderStalled``) breaks the pipeline: it is the outcome of the batch waited
        on and of every batch in progress, no batch starts after it, and :attr:`broken` holds
        it. Closes the pipeline when done."""
        try:
            for _ in range(self._prefetch):
                if not self._start_next():
                    break
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
                self._start_next()
                try:
                    outcome = slot.collated()
                except Exception as exc:
                    outcome = Failure(exc)
                self._flush_stats()
                yield outcome
        finally:
            self.close()

    def _describe(self) -> str:
        """What this pipeline waits for, for stall reports (from the consumer thread)."""
        progress = f"{len(self._slots)} batches in progress"
        if self._client is None:
            return progress
        return f"{progress}, {self._client.describe()}"

    def _flush_stats(self) -> None:
        if self._client is not None:
            self.stats.set("inflight", self._client.in_flight)
        if self._publish is not None:
            self._publish(self.stats)

    def _start_next(self) -> bool:
        """Start the next batch, if there is one (taking it from ``batches`` only now)."""
        if self._closed:
            return False
        indices = next(self._batches, None)
        if indices is None:
            return False
        b = self._next_to_start
        self._next_to_start += 1
        slot = Slot(indices, self._collate, b)
        self._slots[b] = slot
        if self._mode == "remote":
            assert self._runtime is not None
            self._runtime.call_soon(self._start_fetches, slot)
            return True
        job = self._read_and_decode if self._mode == "local" else self._getitem
        for position, index in enumerate(slot.indices):
            self._pool.submit(job if _is_position(index) else self._getitem, slot, position, index)
        return True

    # ------------------------------------------------------------------ remote: on the loop

    def _start_fetches(self, slot: Slot) -> None:
        """One task per sample, created in sampler order (per merged read, for a source
        whose reads of one object coalesce)."""
        if self._closed:
            return
        if isinstance(self._source, CoalescingSource):
            try:
                self._start_merged_fetches(slot, self._source)
            except Exception as exc:  # a bug in planning must fail the batch, not hang it
                slot.fail(exc)
            return
        loop = asyncio.get_running_loop()
        for position, index in enumerate(slot.indices):
            if not _is_position(index):
                self._pool.submit(self._getitem, slot, position, index)
                continue
            task = loop.create_task(self._fetch(slot, position, index))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    def _start_merged_fetches(self, slot: Slot, source: CoalescingSource) -> None:
        """Plan the batch's reads (:mod:`~concurrent_loader.sources.coalesce`), then one task
        per merged read; a sample whose reads cannot be planned fails (or is skipped) alone."""
        loop = asyncio.get_running_loop()
        planned: list[tuple[tuple[int, int], Read]] = []
        for position, index in enumerate(slot.indices):
            if not _is_position(index):
                self._pool.submit(self._getitem, slot, position, index)
                continue
            try:
                reads = source.reads(index)
            except Exception as exc:
                self._failed(slot, position, index, exc)
                continue
            if len(reads) == 1:
                planned.append(((position, index), reads[0]))
            else:
                self._track(loop.create_task(self._fetch(slot, position, index)))
        assert self._budget is not None
        # A merged read is reserved whole: keep it within the budget.
        coalescing = source.coalescing
        if coalescing.max_bytes > self._budget.max_bytes:
            coalescing = dataclasses.replace(coalescing, max_bytes=self._budget.max_bytes)
        for merged in plan_reads(planned, coalescing):
            self._track(loop.create_task(self._fetch_merged(slot, source, merged)))

    def _track(self, task: asyncio.Task[None]) -> None:
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _fetch_merged(
        self, slot: Slot, source: CoalescingSource, merged: MergedRead[tuple[int, int]]
    ) -> None:
        """One GET for several samples; a failure fails (or skips) exactly those samples."""
        if slot.failed:
            return
        try:
            body = await self._read(merged.read)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:
            for part in merged.parts:
                position, index = part.tag
                self._failed(slot, position, index, source.read_failed(index, exc))
            return
        pieces = [(part.tag, part.of(body)) for part in merged.parts]
        # Each sample's bytes are held until it is decoded; the gaps between them are not.
        self._release(len(body) - sum(len(piece) for _, piece in pieces))
        for (position, index), piece in pieces:
            decode = functools.partial(self._decode, slot, position, index, [piece], len(piece))
            try:
                self._decodes.put(slot, position, len(piece), decode)
            except RuntimeError:  # the pool is shut down: we are closing
                self._release(self._decodes.drop_all())

    async def _read(self, read: Read) -> bytes | bytearray:
        """One read within the byte budget; its bytes stay held until released."""
        budget, client = self._budget, self._client
        assert budget is not None and client is not None
        # A large read goes as ranged GETs in flight, so one object can fill the link; the
        # parts in flight hold their bytes until copied into place, so they are reserved too.
        # (Except a whole object a cache wants in one read: it fills its entry from that.)
        expected = read.byte_range.length if read.byte_range is not None else read.size
        capabilities = client.store.capabilities  # the open store's, fixed when it opened
        in_parts = (
            self._parts.applies(expected)
            and capabilities.ranges
            and not (
                read.byte_range is None
                and expected is not None
                and expected <= capabilities.whole_reads_up_to
            )
        )
        size_hint = self._parts.reservation(expected) if in_parts and expected else read.size
        reserved = await budget.reserve(size_hint)
        try:
            if in_parts:
                assert expected is not None
                data: bytes | bytearray = await read_in_parts(
                    client, read.key, read.byte_range, expected, self._parts, observer=self.stats
                )
            else:
                data = await client.get(read.key, read.byte_range, observer=self.stats)
        except BaseException:
            budget.cancel(reserved)
            raise
        budget.settle(reserved, len(data))
        return data

    async def _fetch(self, slot: Slot, position: int, index: int) -> None:
        if slot.failed:
            return
        source = self._source
        assert source is not None
        try:
            reads = source.reads(index)
            if len(reads) == 1:
                bodies: Bodies = [await self._read(reads[0])]
            else:
                bodies = await self._read_all(reads)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:
            self._failed(slot, position, index, exc)
            return
        size = sum(len(body) for body in bodies)
        # Decoded earliest batch first, not in GET completion order (see DecodeQueue).
        decode = functools.partial(self._decode, slot, position, index, bodies, size)
        try:
            self._decodes.put(slot, position, size, decode)
        except RuntimeError:  # the pool is shut down: we are closing
            self._release(self._decodes.drop_all())

    async def _read_all(self, reads: Sequence[Read]) -> Bodies:
        results = await asyncio.gather(*(self._read(r) for r in reads), return_exceptions=True)
        failures = [r for r in results if isinstance(r, BaseException)]
        if failures:
            self._release(sum(len(r) for r in results if not isinstance(r, BaseException)))
            raise failures[0]
        return results  # type: ignore[return-value]

    # ------------------------------------------------------------------ pool jobs

    def _decode(self, slot: Slot, position: int, index: int, bodies: Bodies, size: int) -> None:
        source = self._source
        assert source is not None
        try:
            if slot.failed:
                return
            started = time.perf_counter()
            item = source.decode(index, bodies)
            self.stats.add_decode(time.perf_counter() - started)
        except BaseException as exc:
            self._failed(slot, position, index, exc)
        else:
            slot.put(position, item)
        finally:
            self._release(size)

    def _release(self, size: int) -> None:
        if self._budget is not None:
            self._budget.release(size)

    def _read_and_decode(self, slot: Slot, position: int, index: int) -> None:
        source, store = self._source, self._blocking
        assert source is not None and store is not None

        def produce() -> Any:
            started = time.perf_counter()
            bodies: Bodies = [store.get_blocking(r.key, r.byte_range) for r in source.reads(index)]
            fetched = time.perf_counter()
            self.stats.add_fetch(fetched - started, sum(len(b) for b in bodies))
            item = source.decode(index, bodies)
            self.stats.add_decode(time.perf_counter() - fetched)
            return item

        self._complete(slot, position, index, produce)

    def _getitem(self, slot: Slot, position: int, index: Any) -> None:
        def produce() -> Any:
            started = time.perf_counter()
            item = self._dataset[index]
            self.stats.add_decode(time.perf_counter() - started)
            return item

        self._complete(slot, position, index, produce)

    def _complete(self, slot: Slot, position: int, index: Any, produce: Callable[[], Any]) -> None:
        """Put ``produce()`` in the slot, or fail the sample with what it raised."""
        if slot.failed:
            return
        try:
            item = produce()
        except BaseException as exc:
            self._failed(slot, position, index, exc)
        else:
            slot.put(position, item)

    def _failed(self, slot: Slot, position: int, index: Any, exc: BaseException) -> None:
        """Sample ``index`` failed: skip it (policy "skip", our errors only) or fail its batch."""
        source = self._source
        where = f"item {index!r}"
        if source is not None and _is_position(index):
            with contextlib.suppress(Exception):  # an index out of range has no object
                where = source.url_for(index)
        if self._skip and isinstance(exc, LoaderError):
            self.stats.add("skipped")
            slot.skip(position, SkippedSample(index, exc.url or where, exc))
            return
        if not isinstance(exc, LoaderError):
            # Errors from user code (a transform, a foreign dataset) get the object's name.
            exc.add_note(f"while loading {where} of {type(self._dataset).__name__}")
        slot.fail(exc)

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
                try:
                    runtime.submit(self._cancel_tasks()).result(timeout=CLOSE_TIMEOUT_S)
                except concurrent.futures.TimeoutError:
                    log.warning("the event loop did not cancel this pipeline's GETs in time")
            # Samples fetched but not decoded yet are dropped, not drained by a pool job.
            self._release(self._decodes.drop_all())
            # After a stall a pool thread may be stuck in user code for good: joining it
            # would turn a clear error into the very hang it reports.
            self._pool.shutdown(wait=not self._stalled, cancel_futures=True)
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
        if self._budget is not None:
            self._budget.close()
