"""``ConcurrentDataLoader``: a ``torch.utils.data.DataLoader`` whose workers keep many
requests in flight, pipelined across batches.

How it stays on public PyTorch API: at the start of each epoch the main process draws the
epoch's batches from the (batch) sampler, as a stock DataLoader would, and writes them to a
shared-memory plan. The DataLoader it hands to ``torch`` iterates an ``IterableDataset``
(:class:`_PlannedBatches`): worker ``w`` of ``W`` produces batches ``w, w+W, w+2W, ...`` of
the plan through a :class:`~concurrent_loader.pipeline.BatchPipeline`, and torch's in-order
round-robin over workers returns them as batches ``0, 1, 2, ...``. So batch ``i`` holds
exactly the sampler's batch ``i``, every start method works (workers need only the picklable
dataset and the shared plan), and ``pin_memory``, ``timeout``, ``worker_init_fn``,
``persistent_workers`` and ``prefetch_factor`` keep their torch meaning.

Errors raised inside a worker's pipeline travel to the main process as the original
exception object (type, message and attributes intact) and are raised from ``__next__``.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable, Iterator, Sequence, Sized
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import (
    BatchSampler,
    DataLoader,
    Dataset,
    DistributedSampler,
    IterableDataset,
    RandomSampler,
    Sampler,
    SequentialSampler,
    default_collate,
    default_convert,
    get_worker_info,
)

from .errors import ConfigError
from .pipeline import BatchPipeline
from .stats import StageStats

__all__ = ["ConcurrentDataLoader"]

log = logging.getLogger(__name__)


def _passthrough(batch: Any) -> Any:
    return batch


class _Failure:
    """An exception raised in a worker's pipeline, carried to the main process as data."""

    __slots__ = ("exc",)

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


class _Unbatched:
    """Collate for ``batch_size=None``: each "batch" is one sample, converted as torch does."""

    def __init__(self, convert: Callable[[Any], Any]) -> None:
        self.convert = convert

    def __call__(self, items: list[Any]) -> Any:
        return self.convert(items[0])


class _EpochPlan:
    """The epoch's batches, in shared memory so every worker (also persistent ones) reads them.

    ``indices[offsets[b]:offsets[b+1]]`` is batch ``b``; ``header = [num_batches, epoch]``.
    """

    def __init__(self) -> None:
        self.header = torch.zeros(2, dtype=torch.int64).share_memory_()
        self.indices = torch.zeros(0, dtype=torch.int64).share_memory_()
        self.offsets = torch.zeros(1, dtype=torch.int64).share_memory_()

    def write(self, batches: Sequence[Sequence[int]], epoch: int, *, may_grow: bool) -> None:
        flat = [int(i) for batch in batches for i in batch]
        if len(flat) > self.indices.numel() or len(batches) + 1 > self.offsets.numel():
            if not may_grow:
                raise ConfigError(
                    "the sampler yields more samples this epoch than in the first one, which "
                    "persistent_workers=True cannot take: use persistent_workers=False"
                )
            self.indices = torch.zeros(len(flat), dtype=torch.int64).share_memory_()
            self.offsets = torch.zeros(len(batches) + 1, dtype=torch.int64).share_memory_()
        sizes = torch.tensor([len(b) for b in batches], dtype=torch.int64)
        self.offsets[0] = 0
        torch.cumsum(sizes, 0, out=self.offsets[1 : len(batches) + 1])
        self.indices[: len(flat)] = torch.tensor(flat, dtype=torch.int64)
        self.header[0] = len(batches)
        self.header[1] = epoch

    def batches_for(self, worker: int, num_workers: int) -> list[list[int]]:
        count = int(self.header[0])
        offsets = self.offsets[: count + 1].tolist()
        indices = self.indices
        return [
            indices[offsets[b] : offsets[b + 1]].tolist() for b in range(worker, count, num_workers)
        ]


class _PlannedBatches(IterableDataset[Any]):
    """What torch iterates: each process's share of the plan, through a BatchPipeline."""

    def __init__(
        self,
        dataset: Dataset[Any],
        plan: _EpochPlan,
        collate_fn: Callable[[list[Any]], Any],
        options: dict[str, Any],
    ) -> None:
        self.dataset = dataset
        self.plan = plan
        self.collate_fn = collate_fn
        self.options = options
        self.stats = StageStats()

    def __iter__(self) -> Iterator[Any]:
        info = get_worker_info()
        worker, num_workers = (info.id, info.num_workers) if info is not None else (0, 1)
        batches = self.plan.batches_for(worker, num_workers)
        pipeline = BatchPipeline(
            self.dataset,
            batches,
            collate_fn=self.collate_fn,
            stats=self.stats,
            **self.options,
        )
        try:
            yield from pipeline
        except Exception as exc:
            if info is None:
                raise
            # Hand the exception itself to the main process: torch would re-create it from
            # its message alone and lose its attributes.
            yield _Failure(exc)
        finally:
            pipeline.close()

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]

    def __getattr__(self, name: str) -> Any:
        # Attribute access reads through to the user's dataset (loader.dataset.classes).
        if name.startswith("_") or name in ("dataset", "plan", "collate_fn", "options", "stats"):
            raise AttributeError(name)
        return getattr(self.dataset, name)


class ConcurrentDataLoader(DataLoader[Any]):
    """A ``DataLoader`` that fetches many objects concurrently per worker process.

    Takes every ``torch.utils.data.DataLoader`` argument with the same meaning, plus:

    - ``max_inflight_requests``: GETs in flight at most per process (default 64);
    - ``max_inflight_bytes``: fetched-but-undecoded bytes held at most per process;
    - ``decode_threads``: decode threads per process (default: the process's share of CPUs);
    - ``prefetch_batches``: batches in progress per process ahead of the consumer (default:
      enough to keep ``max_inflight_requests`` busy, at least 2);
    - ``seed``: the shuffle seed shared by all ranks under ``torch.distributed``.

    ``loader.dataset`` is the user's dataset seen through a thin wrapper (attributes read
    through); ``len(loader)`` is the number of batches.
    """

    def __init__(
        self,
        dataset: Dataset[Any],
        batch_size: int | None = 1,
        shuffle: bool | None = None,
        sampler: Sampler[Any] | Iterable[Any] | None = None,
        batch_sampler: Sampler[list[Any]] | Iterable[list[Any]] | None = None,
        num_workers: int = 0,
        collate_fn: Callable[[list[Any]], Any] | None = None,
        pin_memory: bool = False,
        drop_last: bool = False,
        timeout: float = 0,
        worker_init_fn: Callable[[int], None] | None = None,
        multiprocessing_context: Any = None,
        generator: torch.Generator | None = None,
        *,
        prefetch_factor: int | None = None,
        persistent_workers: bool = False,
        pin_memory_device: str = "",
        in_order: bool = True,
        max_inflight_requests: int = 64,
        max_inflight_bytes: int | None = None,
        decode_threads: int | None = None,
        prefetch_batches: int | None = None,
        seed: int = 0,
    ) -> None:
        if isinstance(dataset, IterableDataset):
            raise TypeError(
                "ConcurrentDataLoader needs a map-style dataset (with __getitem__ and __len__); "
                "use torch.utils.data.DataLoader for an IterableDataset"
            )
        if batch_sampler is not None and (
            batch_size != 1 or shuffle or sampler is not None or drop_last
        ):
            raise ValueError(
                "batch_sampler option is mutually exclusive with batch_size, shuffle, sampler, "
                "and drop_last"
            )
        if sampler is not None and shuffle:
            raise ValueError("sampler option is mutually exclusive with shuffle")
        if max_inflight_requests < 1:
            raise ConfigError(f"max_inflight_requests must be >= 1, got {max_inflight_requests}")
        if decode_threads is not None and decode_threads < 1:
            raise ConfigError(f"decode_threads must be >= 1, got {decode_threads}")
        if prefetch_batches is not None and prefetch_batches < 1:
            raise ConfigError(f"prefetch_batches must be >= 1, got {prefetch_batches}")

        if shuffle and generator is None:
            # Seeded from torch's global RNG, so torch.manual_seed() makes runs repeatable.
            seed_value = int(torch.empty((), dtype=torch.int64).random_().item())
            generator = torch.Generator().manual_seed(seed_value)
        self._source = dataset
        self._shuffle = bool(shuffle)
        self._user_sampler = sampler
        self._user_batch_sampler = batch_sampler
        self._batch_size = batch_size
        self._drop_last = drop_last
        self._seed = seed
        self._epoch = 0
        self._epoch_set = False
        self._generator = generator

        if batch_size is None and batch_sampler is None:
            batch_collate: Callable[[list[Any]], Any] = _Unbatched(collate_fn or default_convert)
        else:
            batch_collate = collate_fn or default_collate
        per_batch = batch_size or 1
        workers = max(1, num_workers)
        if decode_threads is None:
            decode_threads = max(1, min(8, _available_cpus() // workers))
        if prefetch_batches is None:
            prefetch_batches = max(2, -(-max_inflight_requests // per_batch) + 1)
        self._plan = _EpochPlan()
        self._planned = _PlannedBatches(
            dataset,
            self._plan,
            batch_collate,
            {
                "max_inflight_requests": max_inflight_requests,
                "max_inflight_bytes": max_inflight_bytes,
                "decode_threads": decode_threads,
                "prefetch_batches": prefetch_batches,
            },
        )
        self.max_inflight_requests = max_inflight_requests
        self.decode_threads = decode_threads
        self.prefetch_batches = prefetch_batches
        super().__init__(
            self._planned,
            batch_size=None,
            num_workers=num_workers,
            collate_fn=_passthrough,
            pin_memory=pin_memory,
            timeout=timeout,
            worker_init_fn=worker_init_fn,
            multiprocessing_context=multiprocessing_context,
            generator=generator,
            prefetch_factor=prefetch_factor,
            persistent_workers=persistent_workers,
            pin_memory_device=pin_memory_device,
            in_order=in_order,
        )
        self._plan_written = False

    # ------------------------------------------------------------------ epochs

    def set_epoch(self, epoch: int) -> None:
        """Number the next epoch (its shuffle under torch.distributed, as DistributedSampler)."""
        self._epoch = epoch
        self._epoch_set = True

    def _index_batches(self) -> Iterable[Sequence[int]]:
        if self._user_batch_sampler is not None:
            return self._user_batch_sampler
        sampler = self._user_sampler or self._default_sampler()
        # batch_size=None: one-sample "batches", which the collate unwraps.
        return BatchSampler(sampler, self._batch_size or 1, self._drop_last)

    def _default_sampler(self) -> Sampler[int]:
        # Read at iteration time, not construction: the dataset may be built before
        # init_process_group.
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            sampler: DistributedSampler[Any] = DistributedSampler(
                self._source,
                num_replicas=dist.get_world_size(),
                rank=dist.get_rank(),
                shuffle=self._shuffle,
                seed=self._seed,
                drop_last=self._drop_last,
            )
            sampler.set_epoch(self._epoch)
            return sampler
        if self._shuffle:
            return RandomSampler(self._source, generator=self._generator)  # type: ignore[arg-type]
        return SequentialSampler(self._source)  # type: ignore[arg-type]

    def __len__(self) -> int:
        batches = self._index_batches()
        if isinstance(batches, Sized):
            return len(batches)
        raise TypeError("the batch sampler has no len()")

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        batches = [list(b) for b in self._index_batches()]
        may_grow = not (self.persistent_workers and self._plan_written)
        self._plan.write(batches, self._epoch, may_grow=may_grow)
        self._plan_written = True
        self._epoch += 1
        return _raise_failures(super().__iter__())

    # ------------------------------------------------------------------ introspection

    @property
    def source_dataset(self) -> Dataset[Any]:
        """The dataset this loader was given."""
        return self._source


def _raise_failures(batches: Iterator[Any]) -> Iterator[Any]:
    failure = None
    for batch in batches:
        if isinstance(batch, _Failure):
            failure = batch.exc
            break
        yield batch
    # Drop torch's iterator before raising so its workers shut down now, not whenever the
    # traceback (which would keep this frame alive) is collected.
    del batches
    if failure is not None:
        raise failure


def _available_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1
