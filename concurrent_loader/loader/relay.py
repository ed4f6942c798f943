"""Bodies the main process fetches for worker processes forked before those bodies arrive.

An epoch that forks its workers with nothing fetched ahead for them (the first) would have
them send their first GETs only once started: the workers' start, then a round trip, then
the first decodes, in a row. With a :class:`Relay`, the main process sends the GETs of each
worker's first batch as ``iter()`` draws the plan, and forks the workers as soon as those
requests are written (a few ms; ``RELAY_SEND_WAIT_S`` at most, in ``loader.dataloader``):
the round trip runs while they start, and a worker decodes each body as soon as it is in.

How a body crosses over: before the fork, the main process makes the bodies' shared mapping
(:class:`~.bodies.SharedBodies`, inherited through ``fork``) and a pipe per worker. The main
process writes a body, then where it lies, then its state (``ARRIVED``; ``MISSED`` for a
failed GET, a body of another size than listed, or no room left), then one byte into every
worker's pipe. A worker's event loop watches its pipe while one of its reads waits for a body
(:meth:`RelaySlot.body`), and each byte wakes it to look at the states again. When the fetch
ends (:meth:`Relay.end`), the main process marks what is still pending ``MISSED``, wakes the
workers and closes its write ends: no state changes after that, and a worker that sees every
state settled (or its pipe's end) closes its read end.

Guarantees:

- Never a wrong or lost sample: a slot serves only the read it was cut for, and only once
  its state says its whole body is in; a read whose slot is ``MISSED`` is fetched by the
  worker itself, as without a relay, and errors are reported there.
- Never a hang: the main process's fetch ends by itself (see ``loader.headstart``), with the
  epoch at the latest, and settles every state then; a worker waits for a state at most
  ``WAIT_S`` seconds all the same, then fetches the read itself.
- Bounded: the first batch of each worker; bodies of ``capacity`` bytes in all (their listed
  sizes, else one process's ``max_inflight_bytes``), the rest the workers' to fetch.
- Only for ``fork`` workers (the mapping and the pipes are inherited). In the main process
  the pipes' read ends are closed once the workers are started, the write ends once the
  fetch ends, the mapping once both are done; in a worker, the other workers' ends at its
  first epoch's start, its own once every state is settled. A worker keeps the slots for its
  first epoch only.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import time
import weakref
from collections.abc import Sequence

from torch.utils.data import get_worker_info

from ..sources import Read
from .bodies import MISSED, PENDING, SharedBodies

__all__ = ["Relay", "RelaySlot", "expire_relays"]

#: seconds at most a worker waits for a body in flight in the main process before it sends
#: its own GET (a safety net: the main process's fetch ends within seconds by itself).
WAIT_S = 10.0


#: the relays this worker attached to (for its first epoch)
_attached: weakref.WeakSet[Relay] = weakref.WeakSet()


def expire_relays() -> None:
    """A worker starts another epoch: the bodies relayed for its first are not used again
    (a later epoch reads its objects anew), and their mapping goes once nothing reads it."""
    for relay in list(_attached):
        relay._bodies.drop()
    _attached.clear()


class Relay:
    """Shared slots for ``reads``, ``capacity`` bytes of bodies in all, for ``workers``
    forked workers."""

    def __init__(self, reads: Sequence[Read], workers: int, capacity: int) -> None:
        # Bodies of ``capacity`` bytes in all, written by the main process.
        self._bodies = SharedBodies(reads, capacity)
        # [read end, write end] per worker; -1 once closed in this process (a closed number
        # may be reused by anything opened next: never closed twice).
        self._pipes = [list(os.pipe()) for _ in range(workers)]
        for _, write in self._pipes:
            os.set_blocking(write, False)
        self._close_pipes = weakref.finalize(self, _close_all, self._pipes)
        self._lock = threading.Lock()  # the loop's thread (deliver, miss, end) and forked()
        self._ended = False  # no state changes any more (main process)
        self._forked = False  # the workers hold their ends (main process)
        # In a worker: its pipe's read end, kept while a state may still change.
        self._pid = 0
        self._fd = -1
        self._changed: asyncio.Future[None] | None = None
        self._watching: asyncio.AbstractEventLoop | None = None  # whose reader is on _fd

    @property
    def reads(self) -> list[Read]:
        return list(self._bodies.reads)

    def slots(self) -> dict[Read, RelaySlot]:
        """A slot per read, to hand to the workers as their ``ready`` bodies."""
        return {read: RelaySlot(self, read) for read in self._bodies.reads}

    # ------------------------------------------------------------------ the main process

    def deliver(self, read: Read, body: bytes | bytearray) -> None:
        """``read``'s body arrived (in the main process)."""
        with self._lock:
            if self._bodies.memory is None or self._ended:
                return
            if not self._bodies.put(read, body):  # no room left, or changed since the listing
                self._bodies.settle(read, MISSED)  # the worker reads it again
            self._notify()

    def miss(self, read: Read) -> None:
        """``read`` will not arrive here (its GET failed): the worker fetches it."""
        with self._lock:
            if self._bodies.memory is not None and not self._ended:
                self._bodies.settle(read, MISSED)
                self._notify()

    def _notify(self) -> None:
        for _, write in self._pipes:
            # A full pipe holds wake-ups enough; a broken one has no worker left to wake.
            with contextlib.suppress(BlockingIOError, BrokenPipeError):
                os.write(write, b"\0")

    def end(self) -> None:
        """The fetch ends: what is still pending is the workers' to fetch (once; later calls
        do nothing). Workers forked after this take what arrived without waiting."""
        with self._lock:
            bodies = self._bodies
            if bodies.memory is None or self._ended:
                return
            self._ended = True
            for read in bodies.reads:
                if bodies.state(read) == PENDING:
                    bodies.settle(read, MISSED)
            self._notify()
            for pipe in self._pipes:
                _close(pipe, 1)
            if self._forked:
                bodies.close()  # the workers keep their own mappings

    def forked(self) -> None:
        """The workers are started (or will not be): close the main process's read ends."""
        with self._lock:
            self._forked = True
            for pipe in self._pipes:
                _close(pipe, 0)
            if self._ended:
                self._bodies.close()

    # ------------------------------------------------------------------ a worker

    def attach(self, worker: int | None = None) -> None:
        """In a worker (``worker``, else torch's worker id), at its first epoch's start: keep
        its own pipe's read end (while a state may change), close every other end it
        inherited."""
        if self._pid == os.getpid():
            return
        self._pid = os.getpid()
        _attached.add(self)
        if worker is None:
            info = get_worker_info()
            worker = info.id if info is not None else -1
        for number, pipe in enumerate(self._pipes):
            _close(pipe, 1)
            if number == worker and pipe[0] >= 0:
                self._fd, pipe[0] = pipe[0], -1
                os.set_blocking(self._fd, False)
            else:
                _close(pipe, 0)
        self._close_if_settled()

    async def _body(self, read: Read) -> bytes | None:
        bodies = self._bodies
        if bodies.memory is None:
            return None
        self.attach()
        deadline = time.monotonic() + WAIT_S
        while bodies.state(read) == PENDING and self._fd >= 0:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            try:
                await asyncio.wait_for(asyncio.shield(self._change()), remaining)
            except TimeoutError:
                return None
            self._close_if_settled()
        return bodies.body(read)

    def _close_if_settled(self) -> None:
        if self._fd >= 0 and self._bodies.memory is not None and self._bodies.settled():
            self._close_fd()

    def _close_fd(self) -> None:
        """Close this worker's read end; another read still waiting on it (its state now
        settled) wakes up. Never closed while the loop watches it."""
        fd, self._fd = self._fd, -1
        if self._watching is not None:
            self._watching.remove_reader(fd)
            self._watching = None
        os.close(fd)
        self._wake()

    def _wake(self) -> None:
        if self._changed is not None and not self._changed.done():
            self._changed.set_result(None)

    def _change(self) -> asyncio.Future[None]:
        """A future resolved at the next byte (or the end) of this worker's pipe."""
        if self._changed is None or self._changed.done():
            loop = asyncio.get_running_loop()
            self._changed = loop.create_future()
            loop.add_reader(self._fd, self._on_readable, loop)
            self._watching = loop
        return self._changed

    def _on_readable(self, loop: asyncio.AbstractEventLoop) -> None:
        # Watched only while a read waits: one wake-up drains every byte written so far.
        loop.remove_reader(self._fd)
        self._watching = None
        try:
            data = os.read(self._fd, 4096)
        except BlockingIOError:
            data = b"\0"
        if not data:  # every write end is closed: no state changes any more
            self._close_fd()
        self._wake()


class RelaySlot:
    """Where one read's body arrives: what a worker's pipeline finds for it in ``ready``."""

    __slots__ = ("_read", "_relay")

    def __init__(self, relay: Relay, read: Read) -> None:
        self._relay = relay
        self._read = read

    @property
    def relay(self) -> Relay:
        return self._relay

    async def body(self) -> bytes | None:
        """The body, once the main process has it; None if the worker must fetch it."""
        return await self._relay._body(self._read)


def _close(pipe: list[int], end: int) -> None:
    """Close one end of ``pipe`` in this process, once."""
    fd, pipe[end] = pipe[end], -1
    if fd >= 0:
        os.close(fd)


def _close_all(pipes: list[list[int]]) -> None:
    """What is still open of ``pipes`` in this process (the relay was collected)."""
    for pipe in pipes:
        _close(pipe, 0)
        _close(pipe, 1)
