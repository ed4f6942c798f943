"""A small ring of reusable pinned host buffers that batches are staged in before their copy.

* a slot is handed out again only after the fence of the copy that last read it completed
  (one event, never a device-wide synchronise); what it keeps alive is released then;
* the ``i``-th tensor staged in a slot gets its ``i``-th buffer, reallocated only when too
  small, so batches of stable shape allocate nothing after one pass around the ring.

One thread (the producer) uses the ring; its counters may be read from any thread.
"""

from __future__ import annotations

import logging
from typing import Protocol

import torch

from ..config import check_count

__all__ = ["Fence", "PinnedRing", "RingSlot"]

log = logging.getLogger(__name__)


class Fence(Protocol):
    """Waited on for the completion of earlier device work (a CUDA event)."""

    def synchronize(self) -> None: ...


class _Done:
    """The fence of a slot that no copy has read yet."""

    def synchronize(self) -> None:
        return None


class RingSlot:
    """One set of staging buffers, plus what must stay alive until its copy has read it."""

    def __init__(self, ring: PinnedRing) -> None:
        self._ring = ring
        self._buffers: list[torch.Tensor] = []
        self._keep_alive: list[object] = []
        self._next_buffer = 0
        self._fence: Fence = _Done()

    @property
    def nbytes(self) -> int:
        return sum(b.numel() for b in self._buffers)

    def staging(self, like: torch.Tensor) -> torch.Tensor:
        """A contiguous buffer with ``like``'s shape and dtype, contents undefined."""
        index = self._next_buffer
        self._next_buffer += 1
        nbytes = like.numel() * like.element_size()
        if index == len(self._buffers):
            self._buffers.append(self._ring._allocate(nbytes))
        elif self._buffers[index].numel() < nbytes:
            # Drop the old buffer before pinning the larger one so the two never coexist.
            self._buffers[index] = torch.empty(0, dtype=torch.uint8)
            self._buffers[index] = self._ring._allocate(nbytes)
        raw = self._buffers[index][:nbytes]
        return raw.view(like.dtype).view(like.shape)

    def keep(self, obj: object) -> None:
        self._keep_alive.append(obj)

    def release(self, fence: Fence) -> None:
        """Every copy that reads this slot has been issued; ``fence`` completes after them."""
        self._fence = fence

    def _reclaim(self) -> None:
        self._fence.synchronize()
        self._fence = _Done()
        self._keep_alive.clear()
        self._next_buffer = 0


class PinnedRing:
    """``slots`` reusable staging slots, handed out round robin; ``pin=False`` gives plain
    host memory (tests of the bookkeeping without CUDA)."""

    def __init__(self, slots: int, *, pin: bool = True) -> None:
        check_count("slots", slots)
        self.pin = pin
        self._slots = [RingSlot(self) for _ in range(slots)]
        self._next_slot = 0
        self._allocations = 0

    def __len__(self) -> int:
        return len(self._slots)

    @property
    def pinned_bytes(self) -> int:
        """Bytes of host memory the ring holds now."""
        return sum(slot.nbytes for slot in self._slots)

    @property
    def allocations(self) -> int:
        """Buffers allocated since the ring was made; stops growing once shapes are stable."""
        return self._allocations

    def acquire(self) -> RingSlot:
        slot = self._slots[self._next_slot]
        self._next_slot = (self._next_slot + 1) % len(self._slots)
        slot._reclaim()
        return slot

    def close(self) -> None:
        """Wait for every copy still reading the ring, then free its buffers."""
        for slot in self._slots:
            slot._reclaim()
            slot._buffers.clear()

    def _allocate(self, nbytes: int) -> torch.Tensor:
        self._allocations += 1
        log.debug("pinning a %d-byte staging buffer (allocation %d)", nbytes, self._allocations)
        return torch.empty(nbytes, dtype=torch.uint8, pin_memory=self.pin)
