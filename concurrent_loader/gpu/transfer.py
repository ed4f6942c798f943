"""Moving one batch to the device (a :data:`Transfer`, the per-batch work of one pass): the
producer enters ``context()`` for its life and calls ``stage``; the consumer calls
``hand_over`` for a batch safe on its stream; ``close`` runs after the producer has ended.
Guarantees of :class:`CUDATransfer`:

* copies and conversions run ``non_blocking`` on their own stream; the consumer's stream
  waits on an event recorded after them: the device is never synchronised whole;
* a pinned buffer is not rewritten before its copy completed (:class:`PinnedRing`: a slot
  is handed out again only after the event of the copy that last read it, and what it kept
  alive is released then); an already pinned, contiguous tensor is copied directly;
* the ``i``-th tensor staged in a ring slot gets its ``i``-th buffer, reallocated only when
  too small, so batches of stable shape allocate nothing after one pass around the ring;
* every device tensor it allocates is ``record_stream``-ed for the consumer's stream;
* leaves that are not CPU tensors pass through untouched; sparse CPU tensors are moved on
  the consumer's thread and stream;
* a top-level list of :class:`~concurrent_loader.decode.EncodedImage` is decoded first
  (:mod:`.decode`), then normalised like any image leaf.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from ..config import check_count
from .decode import EncodedBatchDecoder, decode_images
from .normalize import DeviceImageTransform, ImageTransform
from .tree import Path, map_batch

__all__ = ["CUDATransfer", "HostTransfer", "PinnedRing", "RingSlot", "Transfer"]

log = logging.getLogger(__name__)


class HostTransfer:
    """Moves with a plain ``Tensor.to`` and converts images on the producer thread: for the
    CPU (where the conversion is the work that overlaps loading) and devices other than CUDA."""

    pinned_bytes = 0
    pinned_allocations = 0

    def __init__(self, device: torch.device, transform: ImageTransform) -> None:
        self.device = device
        self._transform = transform
        self._convert = DeviceImageTransform(transform, device)
        self._images = EncodedBatchDecoder(device)

    def context(self) -> contextlib.AbstractContextManager[Any]:
        return torch.no_grad()

    def stage(self, batch: Any) -> Any:
        batch, _ = decode_images(batch, self._images)

        def move(path: Path, leaf: Any) -> Any:
            if not isinstance(leaf, torch.Tensor):
                return leaf
            selected = self._transform.selects(path, leaf)
            leaf = leaf.to(self.device)
            return self._convert(leaf) if selected else leaf

        return map_batch(batch, move)

    def hand_over(self, staged: Any) -> Any:
        return staged

    def close(self) -> None:
        return None


@dataclass
class _InFlight:
    batch: Any
    ready: torch.cuda.Event
    owned: list[torch.Tensor] = field(default_factory=list)
    deferred: bool = False


@dataclass(frozen=True)
class _MoveOnHandOver:
    """A leaf moved by the consumer thread, on its own stream (see CUDATransfer.stage)."""

    tensor: torch.Tensor


class CUDATransfer:
    """Copies on a dedicated CUDA stream through a ring of pinned staging buffers."""

    def __init__(self, device: torch.device, transform: ImageTransform, ring: PinnedRing) -> None:
        self.device = device
        self._transform = transform
        self._ring = ring
        self.stream = torch.cuda.Stream(device)
        # Made under the copy stream so the kernels that use them are ordered after them.
        with torch.cuda.device(device), torch.cuda.stream(self.stream):
            self._convert = DeviceImageTransform(transform, device)
        self._images = EncodedBatchDecoder(device)

    @property
    def pinned_bytes(self) -> int:
        return self._ring.pinned_bytes

    @property
    def pinned_allocations(self) -> int:
        return self._ring.allocations

    @contextlib.contextmanager
    def context(self) -> Iterator[None]:
        # The current device and stream are per thread: the producer sets its own.
        with torch.no_grad(), torch.cuda.device(self.device), torch.cuda.stream(self.stream):
            yield

    def stage(self, batch: Any) -> _InFlight:
        # Encoded images are decoded first, on this (the copy) stream: before a ring slot
        # is taken, so a decode error leaves the ring as it was.
        batch, decoded = decode_images(batch, self._images)
        slot = self._ring.acquire()
        owned: list[torch.Tensor] = []
        deferred = False

        def move(path: Path, leaf: Any) -> Any:
            nonlocal deferred
            if path in decoded and isinstance(leaf, torch.Tensor) and leaf.device == self.device:
                out = self._convert(leaf) if self._transform.selects(path, leaf) else leaf
                owned.append(out)
                return out
            if not isinstance(leaf, torch.Tensor) or leaf.device.type != "cpu":
                return leaf
            if leaf.layout != torch.strided:
                # Sparse and other layouts neither fit a flat staging buffer nor support
                # record_stream: the consumer moves them on its own stream instead.
                deferred = True
                return _MoveOnHandOver(leaf)
            if leaf.is_pinned() and leaf.is_contiguous():
                source = leaf
                slot.keep(leaf)
            else:
                source = slot.staging(leaf)
                source.copy_(leaf)
            out = source.to(self.device, non_blocking=True)
            if self._transform.selects(path, leaf):
                out = self._convert(out)
            owned.append(out)
            return out

        ready = torch.cuda.Event()
        try:
            moved = map_batch(batch, move)
        finally:
            # Even when a leaf fails, copies already issued read the slot: fence them.
            ready.record(self.stream)
            slot.release(ready)
        return _InFlight(moved, ready, owned, deferred)

    def hand_over(self, staged: _InFlight) -> Any:
        consumer = torch.cuda.current_stream(self.device)
        consumer.wait_event(staged.ready)
        for tensor in staged.owned:
            tensor.record_stream(consumer)
        if not staged.deferred:
            return staged.batch
        return map_batch(staged.batch, lambda _, leaf: _moved(leaf, self.device))

    def close(self) -> None:
        self._ring.close()


Transfer = HostTransfer | CUDATransfer


def _moved(leaf: Any, device: torch.device) -> Any:
    return leaf.tensor.to(device) if isinstance(leaf, _MoveOnHandOver) else leaf


class RingSlot:
    """One set of staging buffers, plus what must stay alive until its copy has read it."""

    def __init__(self, ring: PinnedRing) -> None:
        self._ring = ring
        self._buffers: list[torch.Tensor] = []
        self._keep_alive: list[object] = []
        self._next_buffer = 0
        #: completes after the copy that last read this slot (a CUDA event); None before one
        self._fence: torch.cuda.Event | None = None

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

    def release(self, fence: torch.cuda.Event) -> None:
        """Every copy that reads this slot has been issued; ``fence`` completes after them."""
        self._fence = fence

    def _reclaim(self) -> None:
        if self._fence is not None:
            self._fence.synchronize()
        self._fence = None
        self._keep_alive.clear()
        self._next_buffer = 0


class PinnedRing:
    """``slots`` reusable staging slots, handed out round robin, by one thread (the
    producer); ``pin=False`` gives plain host memory (tests of the bookkeeping without CUDA).
    ``allocations``: buffers allocated so far, which stops growing once shapes are stable."""

    def __init__(self, slots: int, *, pin: bool = True) -> None:
        check_count("slots", slots)
        self.pin = pin
        self._slots = [RingSlot(self) for _ in range(slots)]
        self._next_slot = 0
        self.allocations = 0

    @property
    def pinned_bytes(self) -> int:
        """Bytes of host memory the ring holds now."""
        return sum(b.numel() for slot in self._slots for b in slot._buffers)

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
        self.allocations += 1
        log.debug("pinning a %d-byte staging buffer (allocation %d)", nbytes, self.allocations)
        return torch.empty(nbytes, dtype=torch.uint8, pin_memory=self.pin)
