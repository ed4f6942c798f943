"""Bodies the main process fetches for worker processes forked before those bodies arrive.

An epoch that forks its workers with nothing fetched ahead for them (the first) would have
them send their first GETs only once started: the workers' start, then a round trip, then
the first decodes, in a row. With a :class:`Relay`, the main process sends the GETs of each
worker's first batch as ``iter()`` draws the plan, and forks the workers at once: the round
trip runs while they start, and a worker decodes each body as soon as it is in.

How a body crosses over: before the fork, one anonymous shared mapping (``mmap`` with no
file: ``MAP_SHARED``, inherited through ``fork``) is cut into a slot per read, sized from the
listing, plus a state byte per read, and a pipe is opened per worker. The main process writes
a body into its slot, then its state (``ARRIVED``, or ``MISSED`` for a failed GET or a body
of another size than listed), then one byte into every worker's pipe. A worker's event loop
watches its pipe, and a read waiting for its slot (:meth:`RelaySlot.body`) wakes on each byte
and looks at its state. When every read has ended, or the fetch is stopped, the main process
marks what is still pending ``MISSED`` and closes its ends of the pipes; a worker that sees
its pipe's end closes its own.

Guarantees:

- Never a wrong or lost sample: a slot serves only the read it was cut for, and only once
  its state says the whole body (of the listed size) is in; a read whose slot is ``MISSED``
  is fetched by the worker itself, as without a relay, and errors are reported there.
- Never a hang: a worker waits for a slot at most ``WAIT_S`` seconds, then fetches the read
  itself; the main process's fetch ends with the epoch (its end, ``close()``, the
  iterator's collection) at the latest.
- Bounded: the first batch of each worker, within one process's ``max_inflight_bytes``,
  with listed sizes only (reads of unlisted size are the workers' to fetch).
- Only for ``fork`` workers (the mapping and the pipes are inherited); the main process
  closes the pipes' read ends once its workers are started, and the mapping once its fetch
  has ended: nothing of it outlives the epoch's start but the workers' own copies.
"""

from __future__ import annotations

import asyncio
import contextlib
import mmap
import os
import threading
import time
from collections.abc import Sequence

from torch.utils.data import get_worker_info

from ..sources import Read

__all__ = ["Relay", "RelaySlot"]

PENDING, ARRIVED, MISSED = 0, 1, 2

#: seconds at most a worker waits for a body in flight in the main process before it sends
#: its own GET (a safety net: the main process's fetch normally ends within a round trip).
WAIT_S = 30.0


class Relay:
    """Shared slots for ``reads``, ``capacity`` bytes of bodies in all, for ``workers``
    forked workers."""

    def __init__(self, reads: Sequence[Read], workers: int, capacity: int) -> None:
        self._reads = list(dict.fromkeys(reads))
        self._number = {read: number for number, read in enumerate(self._reads)}
        count = len(self._reads)
        # Bodies first, packed in arrival order; then a state byte per read; then where each
        # read's body lies (offset, length), written before its state says ARRIVED.
        self._capacity = capacity
        self._states = capacity
        self._places = capacity + count
        self._memory: mmap.mmap | None = mmap.mmap(-1, max(1, capacity + count + 16 * count))
        self._used = 0  # bytes of bodies written (main process)
        # [read end, write end] per worker; -1 once closed here (a closed number may be
        # reused by anything the process opens next: never closed twice).
        self._pipes = [list(os.pipe()) for _ in range(workers)]
        for _, write in self._pipes:
            os.set_blocking(write, False)
        self._parent = os.getpid()
        self._lock = threading.Lock()  # deliveries (the loop's thread) against end()
        # In a worker (set on its first wait): its pipe's read end, and what waits on it.
        self._pid = 0
        self._fd = -1
        self._changed: asyncio.Future[None] | None = None

    @property
    def reads(self) -> list[Read]:
        return list(self._reads)

    def slots(self) -> dict[Read, RelaySlot]:
        """A slot per read, to hand to the workers as their ``ready`` bodies."""
        return {read: RelaySlot(self, read) for read in self._reads}

    # ------------------------------------------------------------------ the main process

    def deliver(self, read: Read, body: bytes | bytearray) -> None:
        """``read``'s body arrived (in the main process)."""
        number, size = self._number[read], len(body)
        with self._lock:
            memory, offset = self._memory, self._used
            if memory is None:
                return
            if offset + size <= self._capacity and (read.size is None or size == read.size):
                memory[offset : offset + size] = body
                place = self._places + 16 * number
                memory[place : place + 16] = offset.to_bytes(8, "little") + size.to_bytes(
                    8, "little"
                )
                self._used = offset + size
                memory[self._states + number] = ARRIVED
            else:  # no room left, or changed since the listing: the worker reads it again
                memory[self._states + number] = MISSED
            self._notify()

    def miss(self, read: Read) -> None:
        """``read`` will not arrive here (its GET failed): the worker fetches it."""
        with self._lock:
            if self._memory is not None:
                self._memory[self._states + self._number[read]] = MISSED
                self._notify()

    def _notify(self) -> None:
        for _, write in self._pipes:
            # A full pipe holds wake-ups enough; a broken one has no worker left to wake.
            with contextlib.suppress(BlockingIOError, BrokenPipeError):
                os.write(write, b"\0")

    def forked(self) -> None:
        """The workers are started (they hold their read ends): close the main process's."""
        with self._lock:
            for pipe in self._pipes:
                _close(pipe, 0)

    def end(self) -> None:
        """Every read has ended, or the fetch stops: what is still pending is the workers'
        to fetch; close the main process's ends (once; later calls do nothing)."""
        if os.getpid() != self._parent:
            return
        with self._lock:
            memory, self._memory = self._memory, None
            if memory is None:
                return
            for number in range(len(self._reads)):
                if memory[self._states + number] == PENDING:
                    memory[self._states + number] = MISSED
            self._notify()
            for pipe in self._pipes:
                _close(pipe, 0)
                _close(pipe, 1)
            memory.close()  # the workers keep their own mappings

    # ------------------------------------------------------------------ a worker

    async def _body(self, read: Read) -> bytes | None:
        number = self._number[read]
        memory = self._memory
        if memory is None:
            return None
        self._attach()
        deadline = time.monotonic() + WAIT_S
        while (state := memory[self._states + number]) == PENDING and self._fd >= 0:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            try:
                await asyncio.wait_for(asyncio.shield(self._change()), remaining)
            except TimeoutError:
                return None
        if state != ARRIVED:
            return None
        place = self._places + 16 * number
        offset = int.from_bytes(memory[place : place + 8], "little")
        size = int.from_bytes(memory[place + 8 : place + 16], "little")
        return memory[offset : offset + size]

    def _attach(self) -> None:
        """On this worker's first wait: keep its own pipe's read end, close the rest."""
        if self._pid == os.getpid():
            return
        self._pid = os.getpid()
        info = get_worker_info()
        mine = info.id if info is not None else -1
        for number, pipe in enumerate(self._pipes):
            _close(pipe, 1)
            if number == mine:
                self._fd, pipe[0] = pipe[0], -1
                os.set_blocking(self._fd, False)
            else:
                _close(pipe, 0)

    def _change(self) -> asyncio.Future[None]:
        """A future resolved at the next byte (or the end) of this worker's pipe."""
        if self._changed is None or self._changed.done():
            loop = asyncio.get_running_loop()
            self._changed = loop.create_future()
            loop.add_reader(self._fd, self._on_readable, loop)
        return self._changed

    def _on_readable(self, loop: asyncio.AbstractEventLoop) -> None:
        # Watched only while a read waits: one wake-up drains every byte written so far.
        loop.remove_reader(self._fd)
        try:
            data = os.read(self._fd, 4096)
        except BlockingIOError:
            data = b"\0"
        if not data:  # every write end is closed: no state changes any more
            os.close(self._fd)
            self._fd = -1
        if self._changed is not None and not self._changed.done():
            self._changed.set_result(None)


class RelaySlot:
    """Where one read's body arrives: what a worker's pipeline finds for it in ``ready``."""

    __slots__ = ("_read", "_relay")

    def __init__(self, relay: Relay, read: Read) -> None:
        self._relay = relay
        self._read = read

    async def body(self) -> bytes | None:
        """The body, once the main process has it; None if the worker must fetch it."""
        return await self._relay._body(self._read)


def _close(pipe: list[int], end: int) -> None:
    """Close one end of ``pipe`` here, once."""
    fd, pipe[end] = pipe[end], -1
    if fd >= 0:
        os.close(fd)
