"""The main process's head start for new worker processes: on the next epoch, for loaders
whose workers end with each epoch (``persistent_workers=False``; persistent workers have
:mod:`.lookahead`), and on the first epoch of any loader whose workers are forked.

An epoch that starts new worker processes would have them send their first GETs only once
started: one round trip, new connections and the first decodes in a row, where a local disk
has the first files at once. So while an epoch ends, the main process fetches the bodies of
the next epoch's first batches (those of its predicted plan, see
:func:`.lookahead.predict_next_epoch`) into memory; the next epoch's workers, forked with
them, decode those at once and send their own GETs for the batches after, which arrive while
they decode.

No epoch ends before the first, so there the main process fetches the first batch of each
worker when ``iter()`` draws the plan, and forks the workers once those bodies are in
(:meth:`HeadStart.settle`): the round trip then overlaps the main process's own set-up of the
epoch instead of coming after the workers' start, and the workers' first GETs (new
connections and all) are for later batches, sent while they decode. Once half of the bodies
are in, the main process waits at most as long again, so a slow GET delays no fork: what
has not arrived by then is the workers' to fetch.

Guarantees:

- Only bytes move: decoding (the user's transforms and the random numbers they draw) stays
  in the worker that delivers the sample, as without a head start.
- Never a wrong sample: a body is kept under the read (key and byte range) it answers, and a
  worker uses it only for that read; a plan that changed (``set_epoch``, ``load_state_dict``,
  a sampler changed by the user) leaves the bodies unused, so a missed prediction costs GETs,
  not samples. A GET that fails here is left to the worker, which reads the object again and
  reports the error as usual.
- Bounded: the first ``prefetch_batches`` batches of each worker's share at most (on the
  first epoch, one batch per worker), and bodies of one process's ``max_inflight_bytes`` at
  most (reads whose listed size would pass it are not sent; a body of unlisted size that
  would is dropped on arrival), through this process's fetch client and its
  ``max_inflight_requests``.
- Nothing left running between epochs: the fetch starts a few batches before the epoch's
  end, holds a runtime lease only until the epoch ends (or is abandoned: ``break``, garbage
  collection), then GETs still in flight are cancelled and the lease given back: only the
  bodies that arrived stay, until the next epoch starts. The first epoch's fetch ends (the
  same way) before its workers are forked, within ``iter()``.
- Used only where workers receive it for free: workers started by ``fork`` (they inherit the
  main process's memory; the main process drops its copy once they are started) or, for the
  next epoch, the main process itself (``num_workers=0``; its first epoch's GETs go out at
  once from its own pipeline). Workers started by ``spawn`` or ``forkserver`` would
  receive a pickled copy each, after a start-up of about a second that hides the round trip
  anyway.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Sequence
from typing import Any

from ..config import FetchConfig
from ..fetch import client_for
from ..runtime import Runtime, acquire_runtime
from ..sources import Read, SampleSource

__all__ = ["HeadStart", "Ready"]

log = logging.getLogger(__name__)

#: Bodies fetched ahead, by the read they answer.
Ready = dict[Read, bytes | bytearray]


def reads_of(source: SampleSource, batches: Sequence[Sequence[Any]]) -> list[Read]:
    """The reads of ``batches``' samples, in order (positions only: other indices go to the
    dataset's ``__getitem__``)."""
    reads: list[Read] = []
    for batch in batches:
        for index in batch:
            if type(index) is int:
                reads.extend(source.reads(index))
    return reads


class HeadStart:
    """Fetches the reads of ``batches`` (an epoch's first batches) in the background, within
    ``max_bytes``, through this process's client for ``config`` (the one its own pipeline
    uses, whose request limit they share), until :meth:`stop`; :meth:`take` hands over what
    arrived."""

    def __init__(
        self,
        source: SampleSource,
        config: FetchConfig,
        batches: Sequence[Sequence[Any]],
        max_bytes: int,
    ) -> None:
        self._source = source
        self._config = config
        self._batches = batches
        self._max_bytes = max_bytes
        self._arrived: Ready = {}
        self._kept = 0  # bytes of the bodies in _arrived
        self._runtime: Runtime | None = None
        self._task: asyncio.Task[None] | None = None
        self._started = False
        self._lock = threading.Lock()
        self._started_at = 0.0
        self._half_at = 0.0  # when half of the bodies had arrived
        self._answered = threading.Event()  # half of the bodies arrived, or every read ended
        self._finished = threading.Event()  # every read ended (or none was sent)

    def start(self) -> None:
        """Start fetching (once; later calls do nothing)."""
        with self._lock:
            if self._started:
                return
            self._started = True
            reads, budget = [], self._max_bytes
            for read in dict.fromkeys(reads_of(self._source, self._batches)):
                if read.size is not None:
                    if read.size > budget:
                        continue
                    budget -= read.size
                reads.append(read)
            self._started_at = time.monotonic()
            if not reads:
                self._finished.set()
                self._answered.set()
                return
            runtime = self._runtime = acquire_runtime()
            runtime.submit(self._fetch(runtime, reads))

    async def _fetch(self, runtime: Runtime, reads: list[Read]) -> None:
        self._task = asyncio.current_task()
        source = self._source
        client = await client_for(runtime, source.store, self._config)

        arrivals = 0

        async def one(read: Read) -> None:
            nonlocal arrivals
            try:
                body = await client.get(read.key, read.byte_range)
            except Exception as exc:  # the worker reads it again and reports it
                log.debug("head start: %s not fetched ahead (%s)", read.key, type(exc).__name__)
                return
            if self._kept + len(body) <= self._max_bytes:  # sizes not listed: kept by arrival
                self._kept += len(body)
                self._arrived[read] = body
            arrivals += 1
            if 2 * arrivals >= len(reads) and not self._answered.is_set():
                self._half_at = time.monotonic()
                self._answered.set()

        try:
            await asyncio.gather(*(one(read) for read in reads))
        finally:
            self._finished.set()
            self._answered.set()

    def settle(self, timeout: float) -> None:
        """Wait (in another thread than the runtime's) until every read has arrived or
        failed, but once half of the bodies are in, no longer than they took; and
        ``timeout`` seconds at most since :meth:`start`. Reads far behind the others, like
        reads that failed, are left to the workers."""
        deadline = self._started_at + timeout
        if not self._answered.wait(max(0.0, deadline - time.monotonic())):
            return
        if self._finished.is_set():
            return
        patience = self._half_at + (self._half_at - self._started_at)
        self._finished.wait(max(0.0, min(deadline, patience) - time.monotonic()))

    def stop(self) -> None:
        """Cancel the GETs still in flight and give the runtime back; what arrived stays."""
        with self._lock:
            runtime, self._runtime = self._runtime, None
        if runtime is None:
            return
        if runtime.closed:  # closed at the interpreter's exit
            runtime.release()
            return
        if runtime.in_loop_thread():  # a collection on the loop's thread: cannot wait here
            runtime.call_soon(self._cancel_now)
            with self._lock:
                self._runtime = runtime  # released by the next stop() or take()
            return
        try:
            runtime.run(self._cancel())
        finally:
            runtime.release()

    def _cancel_now(self) -> None:
        if self._task is not None:
            self._task.cancel()

    async def _cancel(self) -> None:
        task = self._task
        if task is not None and not task.done():
            task.cancel()
            await asyncio.wait([task])

    def take(self, batches: Sequence[Sequence[Any]]) -> Ready:
        """Stop; the bodies that arrived for the reads of ``batches`` (the epoch that starts
        now: a changed plan finds fewer, or none)."""
        self.stop()
        arrived, self._arrived, self._kept = self._arrived, {}, 0
        wanted = reads_of(self._source, batches)
        ready = {read: arrived[read] for read in wanted if read in arrived}
        log.debug("head start: %d of %d reads fetched ahead", len(ready), len(wanted))
        return ready
