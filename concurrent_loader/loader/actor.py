"""The body of one Ray actor of a :class:`~.ray_workers.RayWorkers`: the process's own
pipeline, one batch per call.

An actor is a long-lived worker process on some node. It holds a runtime lease for its whole
life (as a persistent DataLoader worker does), so its event loop, fetch clients, open
connections and the node-local cache's open files stay from one batch, and one epoch, to the
next. Each call runs the unchanged :class:`~concurrent_loader.pipeline.BatchPipeline` over
one batch; calls run concurrently on the actor's threads (Ray's ``max_concurrency``), so the
batches the trainer has in flight on it share its fetch client, byte budget and connections.

Invariants: a call returns exactly one outcome for its batch (the collated batch, a
``Partial`` or a ``Failure`` carrying the exception as data, so it reaches the trainer with
its type and URL), with this actor's counters so far; nothing here raises for a failed
sample or batch. A batch's tensors cross Ray's object store as numpy arrays (``ship``), which
Ray moves without a copy into or out of the pickle, where a tensor goes through
``torch.save``; the trainer copies each out once (``unship``), so its batch is its own.
"""

from __future__ import annotations

import os
import random
import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from ..gpu.tree import Path, map_batch
from ..metrics import StageStats
from ..metrics.stats import cache_tally
from ..pipeline import BatchPipeline, Failure, Partial, PipelineOptions, source_of
from ..runtime import Runtime, acquire_runtime

__all__ = ["PrepActor", "Setup", "ship", "unship"]


Setup = tuple[
    Dataset[Any], Callable[[list[Any]], Any], PipelineOptions, Callable[[int], None] | None
]


class PrepActor:
    """Makes batches with ``setup``: the dataset, the collate function, the pipeline's options
    and the loader's ``worker_init_fn`` (called with ``index``, as torch calls it in worker
    ``index``); counts into ``stats`` (what an earlier actor in its place counted, so the
    trainer's sums never go back)."""

    def __init__(self, setup: Setup, stats: list[float], index: int) -> None:
        dataset, collate_fn, options, worker_init_fn = setup
        self._dataset = dataset
        self._collate = collate_fn
        self._options = options
        self._stats = StageStats(stats, cache=cache_tally())
        self._lock = threading.Lock()
        self._calls_ended = 0
        source = source_of(dataset)
        # Held until the actor's process ends (it is killed, never asked to stop).
        self._lease: Runtime | None = None
        if source is not None and source.store.capabilities.remote:
            self._lease = acquire_runtime()
        if worker_init_fn is not None:  # as torch calls it in each worker process
            worker_init_fn(index)

    def run(self, seed: int, number: int, indices: Sequence[Any]) -> tuple[Any, int, list[float]]:
        """Batch ``number`` of the epoch whose base seed is ``seed``: its outcome, and the
        actor's counters after it with how many calls had ended then (replies of calls run
        side by side may arrive in either order: the later counters win)."""
        # As torch seeds worker w with base_seed + w: transforms that draw random numbers see
        # a seed that depends on the epoch and the batch, not on which actor ran it.
        torch.manual_seed(seed + number)
        random.seed(seed + number)
        pipeline = BatchPipeline(
            self._dataset,
            [indices],
            collate_fn=self._collate,
            options=self._options,
            stats=self._stats,
        )
        (outcome,) = pipeline.outcomes()
        with self._lock:
            self._calls_ended += 1
            return ship(outcome), self._calls_ended, self._stats.vector()

    def pid(self) -> int:
        return os.getpid()


class Shipped:
    """A CPU tensor on its way through Ray's object store, as its numpy array."""

    __slots__ = ("array",)

    def __init__(self, array: np.ndarray) -> None:
        self.array = array

    def __reduce__(self) -> tuple[Any, ...]:
        return (Shipped, (self.array,))


def _ship_leaf(path: Path, leaf: Any) -> Any:
    # Only a plain, dense tensor that is its whole storage, in order: a subclass keeps its
    # type and metadata, a view or an expanded tensor its layout, as a tensor.
    if (
        type(leaf) is torch.Tensor
        and leaf.device.type == "cpu"
        and leaf.layout == torch.strided
        and not leaf.requires_grad
        and leaf.is_contiguous()
        and leaf.storage_offset() == 0
        and leaf.untyped_storage().nbytes() == leaf.numel() * leaf.element_size()
    ):
        try:
            return Shipped(leaf.numpy())
        except (TypeError, RuntimeError):  # a dtype numpy lacks (bfloat16)
            return leaf
    return leaf


def _unship_leaf(path: Path, leaf: Any) -> Any:
    return torch.from_numpy(leaf.array.copy()) if isinstance(leaf, Shipped) else leaf


def _each_tensor(outcome: Any, leaf: Callable[[Path, Any], Any]) -> Any:
    if isinstance(outcome, Failure):
        return outcome
    if isinstance(outcome, Partial):
        return Partial(map_batch(outcome.batch, leaf), outcome.skipped)
    return map_batch(outcome, leaf)


def ship(outcome: Any) -> Any:
    """``outcome`` with its batch's tensors as :class:`Shipped` arrays."""
    return _each_tensor(outcome, _ship_leaf)


def unship(outcome: Any) -> Any:
    """``ship``'s outcome with tensors again, each a copy the trainer owns."""
    return _each_tensor(outcome, _unship_leaf)
