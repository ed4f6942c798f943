"""The remote producer: a batch's GETs on the event loop (planned by
:func:`~concurrent_loader.sources.base.plan_fetches`), decodes on the decode threads.
Invariants, besides those of :mod:`.produce`:

- fetched-but-undecoded bytes (plus those expected in flight) stay within
  ``FetchConfig.max_inflight_bytes``; every byte reserved is given back once;
- fetched samples are decoded earliest batch first (:class:`~.slot.DecodeQueue`);
- a failed GET fails (or skips) its sample; a failure while planning fails the batch;
- :meth:`RemoteReads.close` cancels and awaits the GETs, drops undecoded samples, joins the
  threads and returns the runtime lease, in that order.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from torch.utils.data import Dataset

from ..fetch import ByteBudget, client_for
from ..fetch.parts import read_in_parts
from ..metrics import StageStats
from ..runtime import CLOSE_TIMEOUT_S, acquire_runtime
from ..sources import Read, SampleSource
from ..sources.base import Get, NamingSource, Whole, plan_fetches
from .options import PipelineOptions, StallWatch
from .produce import SourceSamples, is_position
from .slot import Slot

__all__ = ["RemoteReads"]

log = logging.getLogger(__name__)

Bodies = list[bytes | bytearray]
Tag = tuple[int, int]  # a sample's position in its batch, and its index


class RemoteReads(SourceSamples):
    def __init__(
        self,
        dataset: Dataset[Any],
        source: SampleSource,
        options: PipelineOptions,
        stats: StageStats,
        watch: StallWatch,
    ) -> None:
        config = source.fetch_config
        runtime = self._runtime = acquire_runtime()
        try:
            opening = runtime.submit(
                client_for(runtime, source.store, config, start=options.inflight_start)
            )
            watch.wait(opening, "its fetch client to open")
            self._client = opening.result()
        except BaseException:
            runtime.release()
            raise
        super().__init__(dataset, source, options, stats, "remote")
        self._budget = ByteBudget(config.max_inflight_bytes, runtime.call_soon)
        self._parts = options.parts
        # A shard source's failed reads name the sample's member and offset.
        self._read_failed: Callable[[int, BaseException], BaseException] = (
            source.read_failed if isinstance(source, NamingSource) else lambda index, exc: exc
        )
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = False

    def start(self, slot: Slot) -> None:
        self._runtime.call_soon(self._start_fetches, slot)

    def wants_more(self, samples_in_progress: int) -> bool:
        """While the fetch limit has grown past the samples in progress and decoding keeps
        up (no more fetched samples wait than there are threads): so the limit, which grows
        only while GETs wait for its slots, is fed by the pipeline only where fetching is
        the bottleneck. Read from the consumer's thread: a stale value only delays a batch."""
        decoding_keeps_up = len(self.decodes) <= self.decodes.max_jobs
        return samples_in_progress < self._client.limit.limit and decoding_keeps_up

    def describe(self) -> str:
        return self._client.describe()

    def flush_stats(self) -> None:
        super().flush_stats()
        self.stats.set("inflight", self._client.in_flight)
        self.stats.set("inflight_limit", self._client.limit.limit)

    def _start_fetches(self, slot: Slot) -> None:
        if self._closed:
            return
        samples: list[tuple[Tag, Sequence[Read]]] = []
        for position, index in enumerate(slot.indices):
            if not is_position(index):
                self.pool.submit(self.complete, slot, position, index)
                continue
            try:
                samples.append(((position, index), self.source.reads(index)))
            except Exception as exc:
                self.failed(slot, position, index, exc)
        try:
            capabilities = self._client.store.capabilities  # the open store's
            plan = plan_fetches(samples, capabilities, self._parts)
        except Exception as exc:  # a bug in planning must fail the batch, not hang it
            slot.fail(exc)
            return
        loop = asyncio.get_running_loop()
        for fetch in plan:
            task = loop.create_task(self._fetch(slot, fetch))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _fetch(self, slot: Slot, fetch: Whole[Tag]) -> None:
        if slot.failed:
            return
        position, index = fetch.tag
        try:
            if len(fetch.gets) == 1:
                bodies: Bodies = [await self._get(fetch.gets[0])]
            else:
                bodies = await self._get_all(fetch.gets)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:
            self.failed(slot, position, index, self._read_failed(index, exc))
            return
        size = sum(len(body) for body in bodies)
        decode = functools.partial(self._decode, slot, position, index, bodies, size)
        try:
            self.decodes.put(slot, position, size, decode)
        except RuntimeError:  # the pool is shut down: we are closing
            self._budget.release(self.decodes.drop_all())

    async def _get(self, get: Get) -> bytes | bytearray:
        read = get.read
        reserved = await self._budget.reserve(get.reserve)
        try:
            if get.in_parts is not None:
                data: bytes | bytearray = await read_in_parts(
                    self._client,
                    read.key,
                    read.byte_range,
                    get.in_parts,
                    self._parts,
                    observer=self.stats,
                )
            else:
                data = await self._client.get(read.key, read.byte_range, observer=self.stats)
        except BaseException:
            self._budget.cancel(reserved)
            raise
        self._budget.settle(reserved, len(data))
        return data

    async def _get_all(self, gets: Sequence[Get]) -> Bodies:
        results = await asyncio.gather(*(self._get(g) for g in gets), return_exceptions=True)
        failures = [r for r in results if isinstance(r, BaseException)]
        if failures:
            self._budget.release(sum(len(r) for r in results if not isinstance(r, BaseException)))
            raise failures[0]
        return results  # type: ignore[return-value]

    def _decode(self, slot: Slot, position: int, index: int, bodies: Bodies, size: int) -> bool:
        try:
            if slot.failed:
                return False
            started = time.perf_counter()
            item = self.source.decode(index, bodies)
            self.stats.add_decode(time.perf_counter() - started)
        except BaseException as exc:
            self.failed(slot, position, index, exc)
        else:
            slot.put(position, item)
        finally:
            self._budget.release(size)
        return True

    def close(self, stalled: bool) -> None:
        self._closed = True
        runtime = self._runtime
        try:
            # At interpreter exit the runtime may already be closed (its tasks cancelled).
            if not runtime.closed:
                try:
                    runtime.submit(self._cancel_tasks()).result(timeout=CLOSE_TIMEOUT_S)
                except concurrent.futures.TimeoutError:
                    log.warning("the event loop did not cancel this pipeline's GETs in time")
            # Samples fetched but not decoded yet are dropped, not drained by a pool job.
            self._budget.release(self.decodes.drop_all())
            super().close(stalled)
        finally:
            runtime.release()

    async def _cancel_tasks(self) -> None:
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._budget.close()
