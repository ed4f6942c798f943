"""Prefetching batches onto the GPU while the model computes: :class:`CUDAPrefetcher`.

Each pass (a :class:`PrefetchIterator`, with its own thread, stream and ring) has one
producer thread that pulls batches from the source and stages them (:mod:`.transfer`):

* bounded: ``permits + (pulled - handed_over) == depth``, so at most ``depth`` batches sit
  in device memory besides the loop's own, and the pinned ring has ``depth + 1`` slots;
* batches come out in source order; an exception of the source (or of a move) reaches the
  consumer after every earlier batch, with a note naming the batch, and ends the pass;
* nothing polls, and the producer always queues an end marker, so the consumer never hangs;
* ending early (``break``, ``close()``, leaving ``with``, garbage collection) stops and
  joins the producer, closes the source iterator if it can, and frees the ring.
"""

from __future__ import annotations

import logging
import queue
import threading
import weakref
from collections.abc import Hashable, Iterable, Iterator, Sequence, Sized
from typing import Any

import torch

from ..closing import Closing
from ..config import check_count
from ..errors import ConfigError
from ..pipeline import Failure
from .normalize import DEFAULT_IMAGE_KEYS, ImageTransform
from .transfer import CUDATransfer, HostTransfer, PinnedRing, Transfer

__all__ = ["CUDAPrefetcher", "PrefetchIterator"]

log = logging.getLogger(__name__)

#: how long closing waits for the producer to finish a ``next()`` call on the source
JOIN_TIMEOUT_S = 60.0


_END = object()  # the producer's last item


class _Run:
    def __init__(self, source: Iterable[Any], transfer: Transfer, depth: int) -> None:
        self._items: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._permits = threading.Semaphore(depth)
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._produce,
            args=(source, transfer),
            name="concurrent-loader-prefetch",
            daemon=True,  # a source stuck in next() must not keep the interpreter alive
        )
        self._thread.start()

    def _produce(self, source: Iterable[Any], transfer: Transfer) -> None:
        iterator: Iterator[Any] | None = None
        try:
            with transfer.context():
                iterator = iter(source)
                index = 0
                while self._next_permit():
                    try:
                        batch = next(iterator)
                    except StopIteration:
                        return
                    except BaseException as error:
                        error.add_note(f"raised by the source of CUDAPrefetcher at batch {index}")
                        raise
                    if self._stop.is_set():
                        return
                    try:
                        staged = transfer.stage(batch)
                    except BaseException as error:
                        error.add_note(f"raised moving batch {index} to {transfer.device}")
                        raise
                    self._items.put(staged)
                    # Hold nothing while blocked on the next permit: the consumer owns it now.
                    del batch, staged
                    index += 1
        except BaseException as error:
            self._items.put(Failure(error))
        finally:
            try:
                if callable(close := getattr(iterator, "close", None)):
                    close()
            except Exception:
                log.warning("closing the source iterator of CUDAPrefetcher failed", exc_info=True)
            finally:
                # The traceback of a forwarded error holds this frame: clear the reference
                # so a DataLoader iterator is released (and its workers shut down) now.
                iterator = None
                self._items.put(_END)

    def _next_permit(self) -> bool:
        self._permits.acquire()
        return not self._stop.is_set()

    def get(self) -> Any:
        return self._items.get()

    def handed_over(self) -> None:
        """The consumer has taken a batch: the producer may pull one more."""
        self._permits.release()

    def close(self) -> bool:
        """Stop the producer, wait for it, and drop what it queued; whether it has ended (not
        when stuck in the source's ``next()``, or called on the producer thread)."""
        self._stop.set()
        # One extra permit wakes a producer blocked on the semaphore; it then sees the stop.
        self._permits.release()
        if threading.current_thread() is self._thread:  # collected on the producer thread
            return False
        self._thread.join(JOIN_TIMEOUT_S)
        if self._thread.is_alive():
            log.warning(
                "CUDAPrefetcher's producer thread is still inside the source's next() after "
                "%.0f s; leaving it to finish in the background",
                JOIN_TIMEOUT_S,
            )
            return False
        while not self._items.empty():  # the producer has ended: nothing more comes
            self._items.get_nowait()
        # The drain may have taken the end marker a consumer on another thread waits for.
        self._items.put(_END)
        return True


class PrefetchIterator(Closing, Iterator[Any]):
    """One pass over a :class:`CUDAPrefetcher`; yields batches on its device."""

    def __init__(self, source: Iterable[Any], transfer: Transfer, depth: int) -> None:
        self._transfer = transfer
        self._run = _Run(source, transfer, depth)
        self._done = False
        # close() when the iterator is dropped (after ``break``), and at interpreter exit
        self._finalizer = weakref.finalize(self, _shutdown, self._run, transfer)

    def __next__(self) -> Any:
        if self._done:
            raise StopIteration
        item = self._run.get()
        if item is _END:
            self.close()
            raise StopIteration
        if isinstance(item, Failure):
            self.close()
            raise item.exc
        try:
            return self._transfer.hand_over(item)
        finally:
            self._run.handed_over()

    @property
    def pinned_bytes(self) -> int:
        """Pinned host memory this pass holds for staging."""
        return self._transfer.pinned_bytes

    @property
    def pinned_allocations(self) -> int:
        """Staging buffers this pass has pinned; constant once batch shapes are stable."""
        return self._transfer.pinned_allocations

    @property
    def closed(self) -> bool:
        return self._done

    def close(self) -> None:
        """End the pass: stop and join the producer, close the source, free the ring."""
        self._done = True
        self._finalizer()


def _shutdown(run: _Run, transfer: Transfer) -> None:
    # The ring may be freed only once no producer can stage into it any more.
    if run.close():
        transfer.close()


class CUDAPrefetcher(Closing):
    """Iterates ``source`` with batches moved to ``device`` and images converted there.

    ``source`` is any iterable of batches (a ``ConcurrentDataLoader``, a stock
    ``torch.utils.data.DataLoader``, a list, a generator): tensors, or tuples, lists and
    dicts of them, nested; other leaves (strings, numbers) pass through.

    Args:
        device: where batches go. ``"cuda"`` means the current CUDA device when iteration
            starts. If CUDA is not available, ``"cuda"`` falls back to the CPU with one
            logged warning, unless ``strict`` is true, in which case it raises
            :class:`~concurrent_loader.errors.ConfigError`.
        depth: batches staged ahead of the one the loop is using (``>= 1``); also bounds
            how far the source is read ahead.
        mean, std: per-channel, in 0-1 units; the image becomes ``(x / 255 - mean) / std``.
            Without them images are moved as they are.
        dtype: floating dtype of the normalised image (``torch.bfloat16`` halves its size).
        channels_last: deliver 4-dimensional images in ``torch.channels_last`` format.
        normalize_key: where the image is at the top level of the batch: a position (tuple
            or list), a key (dict), several of them, or ``None`` for no conversion at all.
            Only a ``uint8`` tensor of 3 or 4 dimensions with ``len(mean)`` channels at
            dimension ``-3`` is converted there; see :mod:`concurrent_loader.gpu.normalize`.

    Iterating starts a pass; ``close()`` or leaving a ``with`` block ends every pass still
    open. ``len()`` is the source's.
    """

    def __init__(
        self,
        source: Iterable[Any],
        *,
        device: str | torch.device = "cuda",
        depth: int = 2,
        mean: Sequence[float] | None = None,
        std: Sequence[float] | None = None,
        dtype: torch.dtype = torch.float32,
        channels_last: bool = False,
        normalize_key: Hashable | Sequence[Hashable] | None = DEFAULT_IMAGE_KEYS,
        strict: bool = False,
    ) -> None:
        check_count("depth", depth)
        self.source = source
        self.depth = depth
        self.transform = ImageTransform.build(
            mean=mean,
            std=std,
            dtype=dtype,
            channels_last=channels_last,
            normalize_key=normalize_key,
        )
        #: the device batches go to; a bare ``cuda`` gets its index when a pass starts
        self.device = torch.device(device)
        if self.device.type == "cuda" and not torch.cuda.is_available():
            if strict:
                raise ConfigError(f"device {str(device)!r} was asked for but CUDA is not available")
            log.warning(
                "CUDA is not available: CUDAPrefetcher delivers batches on the CPU instead of %s",
                self.device,
            )
            self.device = torch.device("cpu")
        self._open: weakref.WeakSet[PrefetchIterator] = weakref.WeakSet()

    def __iter__(self) -> PrefetchIterator:
        device = self.device
        transfer: Transfer
        if device.type == "cuda":
            if device.index is None:
                # Read now, not at construction: the loop may call set_device() in between.
                device = torch.device("cuda", torch.cuda.current_device())
            transfer = CUDATransfer(device, self.transform, PinnedRing(self.depth + 1))
        else:
            transfer = HostTransfer(device, self.transform)
        iterator = PrefetchIterator(self.source, transfer, self.depth)
        self._open.add(iterator)
        return iterator

    def __len__(self) -> int:
        if not isinstance(self.source, Sized):
            raise TypeError(f"the source of this CUDAPrefetcher ({self.source!r}) has no len()")
        return len(self.source)

    @property
    def pinned_bytes(self) -> int:
        """Pinned host memory held for staging by the passes still open."""
        return sum(iterator.pinned_bytes for iterator in list(self._open))

    def close(self) -> None:
        """End every pass still open."""
        for iterator in list(self._open):
            iterator.close()
