"""Bodies that one process writes and processes forked after them read, in an anonymous
shared mapping (``mmap`` with no file: ``MAP_SHARED``, inherited through ``fork``).

Layout: the bodies, packed as they arrive; then a state byte per read (``PENDING``,
``ARRIVED``, ``MISSED``); then where each read's body lies (offset and length, 8 bytes
each).

Guarantees:

- A body is used only whole: its writer writes the body, then where it lies, then its state
  (``ARRIVED``, last), so a reader that sees ``ARRIVED`` finds the whole body; a writer that
  dies midway leaves its read ``PENDING``, never half a body ``ARRIVED``.
- Never another read's body: each read has its own state and place, and a body is kept only
  if it is of the read's listed size (when one is listed).
- Bounded: bodies of ``capacity`` bytes in all; a body with no room left is not written
  (its read is for its reader to fetch).
- One writing process: where the next body goes is known to the writer only.
"""

from __future__ import annotations

import mmap
from collections.abc import Sequence

from ..sources import Read

__all__ = ["ARRIVED", "MISSED", "PENDING", "SharedBodies"]

PENDING, ARRIVED, MISSED = 0, 1, 2


class SharedBodies:
    """Room for the bodies of ``reads`` (each once), ``capacity`` bytes of them in all."""

    def __init__(self, reads: Sequence[Read], capacity: int) -> None:
        self.reads = list(dict.fromkeys(reads))
        self._number = {read: number for number, read in enumerate(self.reads)}
        count = len(self.reads)
        self._capacity = capacity
        self._used = 0  # bytes of bodies written (the writer's count)
        self._states = capacity
        self._places = capacity + count
        #: None once this process dropped its mapping (others keep theirs)
        self.memory: mmap.mmap | None = mmap.mmap(-1, max(1, capacity + 17 * count))

    def put(self, read: Read, body: bytes | bytearray) -> bool:
        """Write ``read``'s body, then where it lies, then ``ARRIVED``; False (nothing
        written) if there is no room left, or the body is not of the read's listed size."""
        memory, size, offset = self.memory, len(body), self._used
        if memory is None or offset + size > self._capacity:
            return False
        if read.size is not None and size != read.size:  # changed since the listing
            return False
        number = self._number[read]
        memory[offset : offset + size] = body
        place = self._places + 16 * number
        memory[place : place + 16] = offset.to_bytes(8, "little") + size.to_bytes(8, "little")
        self._used = offset + size
        memory[self._states + number] = ARRIVED
        return True

    def state(self, read: Read) -> int:
        """``read``'s state (``MISSED`` once this process dropped the mapping)."""
        memory = self.memory
        return MISSED if memory is None else memory[self._states + self._number[read]]

    def settle(self, read: Read, state: int) -> None:
        """Set ``read``'s state (``MISSED``: its reader fetches it)."""
        if self.memory is not None:
            self.memory[self._states + self._number[read]] = state

    def settled(self) -> bool:
        """True when no read is ``PENDING`` any more."""
        return all(self.state(read) != PENDING for read in self.reads)

    def body(self, read: Read) -> bytes | None:
        """A copy of ``read``'s body if its state is ``ARRIVED``, else None."""
        memory = self.memory
        number = self._number[read]
        if memory is None or memory[self._states + number] != ARRIVED:
            return None
        place = self._places + 16 * number
        offset = int.from_bytes(memory[place : place + 8], "little")
        size = int.from_bytes(memory[place + 8 : place + 16], "little")
        return memory[offset : offset + size]

    def close(self) -> None:
        """Unmap it in this process (processes forked before keep their own mapping)."""
        memory, self.memory = self.memory, None
        if memory is not None:
            memory.close()

    def drop(self) -> None:
        """Let go of it in this process: unmapped once nothing here reads it any more."""
        self.memory = None
