"""Moving one batch to the device: ``stage`` on the producer thread, ``hand_over`` on the
consumer's. Guarantees of :class:`CUDATransfer`:

* copies and conversions run ``non_blocking`` on their own stream; the consumer's stream
  waits on an event recorded after them: the device is never synchronised whole;
* a pinned buffer is not rewritten before its copy completed (:class:`.ring.PinnedRing`); an
  already pinned, contiguous tensor is copied directly and kept alive until then;
* every device tensor it allocates is ``record_stream``-ed for the consumer's stream;
* leaves that are not CPU tensors pass through untouched; sparse CPU tensors are moved on
  the consumer's thread and stream;
* a top-level list of :class:`~concurrent_loader.decode.EncodedImage` is decoded first
  (:mod:`.decode`), then normalised like any image leaf.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

import torch

from .decode import EncodedBatchDecoder, decode_images
from .normalize import ImageTransform
from .ring import PinnedRing
from .tree import Path, map_batch

__all__ = ["CUDATransfer", "HostTransfer", "Transfer"]

S = TypeVar("S")


class Transfer(Protocol[S]):
    """The per-batch work of one pass: the producer enters :meth:`context` for its life and
    calls :meth:`stage`; the consumer calls :meth:`hand_over` for a batch safe on its
    stream; :meth:`close` runs after the producer has ended."""

    device: torch.device

    def context(self) -> contextlib.AbstractContextManager[None]: ...

    def stage(self, batch: Any) -> S: ...

    def hand_over(self, staged: S) -> Any: ...

    @property
    def pinned_bytes(self) -> int: ...

    @property
    def pinned_allocations(self) -> int: ...

    def close(self) -> None: ...


class HostTransfer:
    """Moves with a plain ``Tensor.to`` and converts images on the producer thread: for the
    CPU (where the conversion is the work that overlaps loading) and devices other than CUDA."""

    pinned_bytes = 0
    pinned_allocations = 0

    def __init__(self, device: torch.device, transform: ImageTransform) -> None:
        self.device = device
        self._transform = transform
        self._convert = transform.on(device)
        self._images = EncodedBatchDecoder(device)

    @contextlib.contextmanager
    def context(self) -> Iterator[None]:
        with torch.no_grad():
            yield

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
            self._convert = transform.on(device)
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
        return map_batch(staged.batch, self._move_deferred)

    def _move_deferred(self, path: Path, leaf: Any) -> Any:
        return leaf.tensor.to(self.device) if isinstance(leaf, _MoveOnHandOver) else leaf

    def close(self) -> None:
        self._ring.close()
