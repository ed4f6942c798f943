"""The main process's head start on the next epoch, for loaders whose workers end with each
epoch (``persistent_workers=False``; persistent workers have :mod:`.lookahead`).

Each such epoch starts new worker processes, which send their first GETs only once started:
one round trip, new connections and the first decodes in a row, where a local disk has the
first files at once. So while an epoch ends, the main process fetches the bodies of the next
epoch's first batches (those of its predicted plan, see :func:`.lookahead.predict_next_epoch`)
into memory; the next epoch's workers, forked with them, decode those at once and send
their own GETs for the batches after, which arrive while they decode.

An epoch with nothing fetched ahead for its new workers (the first, with or without
persistent workers) has the same fetch started by ``iter()`` itself, for the first batch of
each worker, and handed over through a :class:`~.relay.Relay` (``relay=``): the workers are
forked once its requests are written (:meth:`HeadStart.wait_sent`), and each body reaches
them as it arrives. Such a fetch waits for its reads
until half of the bodies are in, then at most as long again, and ``RELAY_WAIT_S`` at most in
all; what is left by then is the workers' to fetch, so a few slow GETs hold no worker's
first batch for long.

Guarantees:

- Only bytes move: decoding (the user's transforms and the random numbers they draw) stays
  in the worker that delivers the sample, as without a head start.
- Never a wrong sample: a body is kept under the read (key and byte range) it answers, and a
  worker uses it only for that read; a plan that changed (``set_epoch``, ``load_state_dict``,
  a sampler changed by the user) leaves the bodies unused, so a missed prediction costs GETs,
  not samples. A GET that fails here is left to the worker, which reads the object again and
  reports the error as usual.
- Bounded: the first ``prefetch_batches`` batches of each worker's share at most, and bodies
  of one process's ``max_inflight_bytes`` at most (reads whose listed size would pass it are
  not sent; a body of unlisted size that would is dropped on arrival), through this
  process's fetch client and its ``max_inflight_requests``.
- Nothing left running between epochs: the fetch starts a few batches before the epoch's
  end, holds a runtime lease only until the epoch ends (or is abandoned: ``break``, garbage
  collection), then GETs still in flight are cancelled and the lease given back: only the
  bodies that arrived stay, until the next epoch starts.
- Used only where workers receive it for free: workers started by ``fork`` (they inherit the
  main process's memory; the main process drops its copy once they are started) or the main
  process itself (``num_workers=0``). Workers started by ``spawn`` or ``forkserver`` would
  receive a pickled copy each, after a start-up of about a second that hides the round trip
  anyway.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Iterable, Sequence
from typing import Any

from ..config import FetchConfig
from ..fetch import client_for
from ..pipeline.batches import PendingBody
from ..runtime import Runtime, acquire_runtime
from ..sources import Read, SampleSource
from ..transport.pool import request_sent
from .relay import Relay

__all__ = ["HeadStart", "Ready", "reads_of", "within"]

log = logging.getLogger(__name__)

#: Bodies fetched ahead (or on their way, through a relay), by the read they answer.
Ready = dict[Read, bytes | bytearray | PendingBody]


def within(reads: Iterable[Read], max_bytes: int) -> list[Read]:
    """``reads`` once each, in order, but those whose listed size would take the total past
    ``max_bytes`` (reads of unlisted size are kept: they are bounded on arrival)."""
    kept, budget = [], max_bytes
    for read in dict.fromkeys(reads):
        if read.size is not None:
            if read.size > budget:
                continue
            budget -= read.size
        kept.append(read)
    return kept


def reads_of(source: SampleSource, batches: Sequence[Sequence[Any]]) -> list[Read]:
    """The reads of ``batches``' samples, in order (positions only: other indices go to the
    dataset's ``__getitem__``)."""
    reads: list[Read] = []
    for batch in batches:
        for index in batch:
            if type(index) is int:
                reads.extend(source.reads(index))
    return reads


#: seconds at most the main process's fetch for a relay runs, whatever has arrived: then
#: what is still in flight is the workers' to fetch.
RELAY_WAIT_S = 2.0


async def _half_then_as_long_again(tasks: Sequence[asyncio.Future[bool]]) -> None:
    """Wait until every task is done, but once half of them have answered True (a body
    arrived), no longer than that took."""
    loop = asyncio.get_running_loop()
    started, pending, arrived = loop.time(), set(tasks), 0
    while pending and 2 * arrived < len(tasks):
        done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
        arrived += sum(1 for task in done if not task.cancelled() and task.result())
    if pending:
        await asyncio.wait(pending, timeout=loop.time() - started)


async def _relay_all(relay: Relay, tasks: Sequence[asyncio.Future[bool]]) -> None:
    """Workers wait for these: once half of the bodies are in, the rest get as long
    again, ``RELAY_WAIT_S`` at most in all; then what is left is the workers' to fetch
    (a few slow GETs hold no worker's first batch)."""
    try:
        async with asyncio.timeout(RELAY_WAIT_S):
            await _half_then_as_long_again(tasks)
    except TimeoutError:
        pass
    finally:
        relay.end()  # before the wait below: a cancellation there must not skip it
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


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
        relay: Relay | None = None,
    ) -> None:
        self._source = source
        self._config = config
        self._batches = batches
        self._max_bytes = max_bytes
        self._relay = relay
        self._arrived: Ready = {}
        self._kept = 0  # bytes of the bodies in _arrived
        self._runtime: Runtime | None = None
        self._task: asyncio.Task[None] | None = None
        self._started = False
        self._lock = threading.Lock()
        #: the fetch has ended (every read, or it was stopped)
        self.finished = False
        self._sent = threading.Event()  # a relay's GETs are all written (or it ended)

    def start(self) -> None:
        """Start fetching (once; later calls do nothing)."""
        with self._lock:
            if self._started:
                return
            self._started = True
            reads = (
                self._relay.reads
                if self._relay is not None
                else within(reads_of(self._source, self._batches), self._max_bytes)
            )
            if not reads:
                if self._relay is not None:
                    self._relay.end()
                self.finished = True
                self._sent.set()
                return
            runtime = self._runtime = acquire_runtime()
            runtime.submit(self._fetch(runtime, reads))

    async def _fetch(self, runtime: Runtime, reads: list[Read]) -> None:
        self._task = asyncio.current_task()
        relay = self._relay
        try:
            client = await client_for(runtime, self._source.store, self._config)

            async def one(read: Read) -> bool:
                try:
                    body = await client.get(read.key, read.byte_range)
                except Exception as exc:  # the worker reads it again and reports it
                    log.debug("head start: %s not fetched ahead (%s)", read.key, type(exc).__name__)
                    if relay is not None:
                        relay.miss(read)
                    return False
                if relay is not None:
                    relay.deliver(read, body)
                elif self._kept + len(body) <= self._max_bytes:  # unlisted: kept by arrival
                    self._kept += len(body)
                    self._arrived[read] = body
                return True

            if relay is None:
                await asyncio.gather(*(one(read) for read in reads))
            else:
                unsent = len(reads)

                def one_sent() -> None:
                    nonlocal unsent
                    unsent -= 1
                    if unsent == 0:
                        self._sent.set()

                # The GETs' tasks copy the context: each tells when its request is written.
                token = request_sent.set(one_sent)
                try:
                    tasks = [asyncio.ensure_future(one(read)) for read in reads]
                finally:
                    request_sent.reset(token)
                await _relay_all(relay, tasks)
        finally:
            if relay is not None:
                relay.end()  # also where opening the client failed: no worker waits on
            self.finished = True
            self._sent.set()

    def wait_sent(self, timeout: float) -> None:
        """Wait until every GET of a relay's fetch is written (its first attempt), or it
        ended, ``timeout`` seconds at most: the main process forks its workers after that,
        so that their start does not hold back requests waiting for this process's CPU."""
        self._sent.wait(timeout)

    def stop(self) -> None:
        """Cancel the GETs still in flight and give the runtime back; what arrived stays."""
        with self._lock:
            runtime, self._runtime = self._runtime, None
        if runtime is None:
            return
        if runtime.closed:  # closed at the interpreter's exit
            runtime.release()
            self._end_relay()
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
            self._end_relay()

    def _end_relay(self) -> None:
        # Also where the fetch was stopped before it ran: workers must not wait for it.
        if self._relay is not None:
            self._relay.end()

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
