"""The next epoch's first batches, fetched by this epoch's workers for the next epoch's new
ones: loaders whose ``fork`` workers end with each epoch (``persistent_workers=False``;
persistent workers have :mod:`.lookahead`, the main process alone has :mod:`.headstart`).

Each such epoch starts new worker processes, which send their first GETs only once started:
one round trip, new connections and the first decodes in a row, where a local disk has the
first files at once. So ``iter()``, which draws the epoch's plan and predicts the next one
(:func:`.lookahead.predict_next_epoch`), makes a :class:`Handoff` before it forks the
epoch's workers: room in shared memory (:class:`~.bodies.SharedBodies`, one region per
worker) for the reads of the next epoch's first batches, split in one part per worker. Each
worker, once its pipeline has started the last batch of its share (``prefetch_batches``
before its end), GETs its part through its own client (its warm connections, within its
request limit) into its region. The next ``iter()`` takes the bodies that are whole by then
for reads of its actual first batches (:meth:`Handoff.take`) and forks its workers with
them; they decode those at once and send their own GETs for the batches after.

The main process sends no GET for it (before, it fetched these bodies itself with a runtime,
client and connections made anew each epoch, into memory that is fresh after each fork).

Guarantees:

- Only bytes move: decoding (the user's transforms and the random numbers they draw) stays
  in the worker that delivers the sample.
- Never a wrong sample: a body is used only for the read it answers (key and byte range; of
  its listed size when one is listed), and only if it is whole when the next epoch starts; a
  plan that changed (``set_epoch``, ``load_state_dict``, a sampler changed by the user)
  leaves the bodies unused, so a missed prediction costs GETs, not samples. A GET that
  fails here is left to the next epoch's worker, which reads the object again and reports
  the error as usual.
- Never a wait for it: a worker does not wait for its part (GETs still in flight at the end
  of its share go on while the worker lives, until the epoch ends), and the next epoch's
  workers take what is whole when they are forked and fetch the rest themselves.
- Bounded: the first ``prefetch_batches`` batches of each worker's share, each read in one
  part only; bodies of one process's ``max_inflight_bytes`` in all (exactly the listed sizes
  where every size is listed; else an even share per worker, and a body with no room left
  is not kept).
- Nothing left running between epochs: the GETs end with the worker process that sent
  them (with its epoch; a share left early cancels them at once). The shared memory stays
  mapped in the main process from the ``iter()`` that made it until the next epoch's
  workers are forked (or the loader goes).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from ..config import FetchConfig
from ..fetch import client_for
from ..runtime import Runtime
from ..sources import Read, SampleSource
from .bodies import ARRIVED, SharedBodies
from .headstart import Ready, reads_of, within

__all__ = ["Handoff", "PartFetch", "handoff_for", "then"]

log = logging.getLogger(__name__)


def handoff_for(
    source: SampleSource, batches: Sequence[Sequence[Any]], workers: int, max_bytes: int
) -> Handoff | None:
    """A :class:`Handoff` of the reads of ``batches`` (the next epoch's first batches, in
    order), part ``w`` the reads of batches ``w, w+workers, ...`` (what worker ``w`` starts
    with), within ``max_bytes`` in all; None when there is nothing to fetch."""
    share = max_bytes // workers
    parts: list[list[Read]] = []
    regions: list[int] = []
    seen: set[Read] = set()
    for worker in range(workers):
        first = reads_of(source, batches[worker::workers])
        reads = [read for read in within(first, share) if read not in seen]
        seen.update(reads)
        parts.append(reads)
        listed = all(read.size is not None for read in reads)
        regions.append(sum(read.size or 0 for read in reads) if listed else share)
    if not seen:
        return None
    return Handoff(parts, regions)


class Handoff:
    """Room for the bodies of ``parts[w]`` in a region of ``regions[w]`` bytes, written by
    worker ``w`` (:class:`PartFetch`), taken by the main process (:meth:`take`)."""

    def __init__(self, parts: Sequence[Sequence[Read]], regions: Sequence[int]) -> None:
        self.parts = [list(part) for part in parts]
        self.bodies = SharedBodies([read for part in parts for read in part], regions)

    # ------------------------------------------------------------------ the main process

    def take(self, source: SampleSource, batches: Sequence[Sequence[Any]]) -> Ready:
        """The bodies that are whole now for the reads of ``batches`` (the epoch that starts
        now: a changed plan finds fewer, or none), for its workers to inherit."""
        bodies = self.bodies
        wanted = reads_of(source, batches)
        ready: Ready = {
            read: Arrived(bodies, read)
            for read in wanted
            if read in bodies and bodies.state(read) == ARRIVED
        }
        log.debug("handoff: %d of %d reads fetched ahead", len(ready), len(wanted))
        return ready

    def close(self) -> None:
        """Unmap it in the main process (the workers forked since keep their mappings)."""
        self.bodies.close()


class Arrived:
    """A body whole in a :class:`Handoff`: what a worker's pipeline finds for its read in
    ``ready``."""

    __slots__ = ("_bodies", "_read")

    def __init__(self, bodies: SharedBodies, read: Read) -> None:
        self._bodies = bodies
        self._read = read

    async def body(self) -> bytes | None:
        return self._bodies.body(self._read)


# ---------------------------------------------------------------------------- a worker


class PartFetch:
    """Worker ``part``'s GETs of its part of ``handoff``, through this process's client for
    ``store`` under ``config`` (the one its pipeline uses): :meth:`start` once its share is
    started; they run until the process ends, or :meth:`cancel` if the share ends early."""

    def __init__(
        self,
        handoff: Handoff,
        part: int,
        runtime: Runtime,
        source: SampleSource,
        config: FetchConfig,
    ) -> None:
        self._handoff = handoff
        self._part = part
        self._runtime = runtime
        self._source = source
        self._config = config
        self._future: concurrent.futures.Future[None] | None = None

    def start(self) -> None:
        """Start the GETs (once; later calls do nothing)."""
        if self._future is None and self._handoff.parts[self._part]:
            self._future = self._runtime.submit(self._fetch())

    async def _fetch(self) -> None:
        client = await client_for(self._runtime, self._source.store, self._config)
        bodies, part = self._handoff.bodies, self._part

        async def one(read: Read) -> None:
            try:
                body = await client.get(read.key, read.byte_range)
            except Exception as exc:  # the next epoch's worker reads it again and reports it
                log.debug("handoff: %s not fetched ahead (%s)", read.key, type(exc).__name__)
                return
            bodies.put(read, body, part)

        await asyncio.gather(*(one(read) for read in self._handoff.parts[part]))

    def cancel(self) -> None:
        """Cancel the GETs still in flight."""
        if self._future is not None:
            self._future.cancel()


def then(batches: Iterable[list[Any]], action: Callable[[], None]) -> Iterator[list[Any]]:
    """``batches``, then ``action()`` once they are all taken."""
    yield from batches
    action()
