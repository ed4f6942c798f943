"""What torch's DataLoader iterates: each process's share of the epoch's plan, produced by
a :class:`~concurrent_loader.pipeline.BatchPipeline`.

Exceptions raised in a worker's pipeline travel to the main process as the original object
(:class:`Failure`), not re-created from their message as torch would do, so their type and
attributes (``url``, ``cause``, ...) arrive intact.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any

from torch.utils.data import Dataset, IterableDataset, get_worker_info

from ..metrics import SharedStats
from ..pipeline import BatchPipeline, PipelineOptions, source_of
from ..runtime import Runtime, acquire_runtime
from .plan import EpochPlan

__all__ = ["Failure", "PlannedBatches"]

# A worker process keeps one runtime lease for its whole life, so a persistent worker keeps
# its event loop, fetch clients and open connections from one epoch to the next instead of
# closing them when each epoch's pipeline closes. The process's exit ends them.
_process_lease: Runtime | None = None


def _hold_runtime_for_this_process() -> None:
    global _process_lease
    if _process_lease is None or _process_lease.pid != os.getpid():
        _process_lease = acquire_runtime()


class Failure:
    """An exception raised in a worker's pipeline, carried to the main process as data."""

    __slots__ = ("exc",)

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


class PlannedBatches(IterableDataset[Any]):
    """Worker ``w`` of ``W`` yields plan batches ``w, w+W, ...``, collated, in order."""

    def __init__(
        self,
        dataset: Dataset[Any],
        plan: EpochPlan,
        collate_fn: Callable[[list[Any]], Any],
        options: PipelineOptions,
        shared_stats: SharedStats,
    ) -> None:
        self.dataset = dataset
        self.plan = plan
        self.collate_fn = collate_fn
        self.options = options
        self.shared_stats = shared_stats

    def __iter__(self) -> Iterator[Any]:
        info = get_worker_info()
        worker, num_workers = (info.id, info.num_workers) if info is not None else (0, 1)
        row = worker + 1 if info is not None else 0
        batches = self.plan.batches_for(worker, num_workers)
        source = source_of(self.dataset)
        if info is not None and source is not None and source.store.capabilities.remote:
            _hold_runtime_for_this_process()
        shared = self.shared_stats
        shared.register(row)
        pipeline: BatchPipeline | None = None
        try:
            pipeline = BatchPipeline(
                self.dataset,
                batches,
                collate_fn=self.collate_fn,
                options=self.options,
                # Counting goes on from what earlier epochs (or processes) left in the row.
                stats=shared.read(row),
                publish=lambda stats: shared.write(row, stats),
            )
            yield from pipeline
        except Exception as exc:
            if info is None:
                raise
            yield Failure(exc)
        finally:
            if pipeline is not None:
                pipeline.close()

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]

    def __getattr__(self, name: str) -> Any:
        # Attribute access reads through to the user's dataset (loader.dataset.classes).
        if name.startswith("_") or name in (
            "dataset",
            "plan",
            "collate_fn",
            "options",
            "shared_stats",
        ):
            raise AttributeError(name)
        return getattr(self.dataset, name)
