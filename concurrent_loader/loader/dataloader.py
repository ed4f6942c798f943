"""``ConcurrentDataLoader``: a ``torch.utils.data.DataLoader`` whose workers keep many
requests in flight, pipelined across batches, on public PyTorch API only.

Torch validates the user's arguments and sets every attribute. Each epoch draws, in torch's
order, the workers' base seed (new iterators only) and then all the sampler's batches into a
shared :class:`~.plan.EpochPlan`; an inner, plain DataLoader (the user's worker settings, a
generator holding the same base seed) iterates :class:`~.worker.PlannedBatches` over it. An
``IterableDataset`` is iterated as a stock DataLoader does.
"""

from __future__ import annotations

import functools
import logging
import time
import warnings
from collections.abc import Callable, Iterable, Iterator
from contextlib import nullcontext
from typing import Any, TypeVar

import torch
import torch.multiprocessing
from torch.utils.data import (
    BatchSampler,
    DataLoader,
    Dataset,
    DistributedSampler,
    IterableDataset,
    Sampler,
)

from ..errors import ConfigError
from ..metrics import SharedStats, StallLedger, loader_stats
from ..pipeline import PipelineOptions, SkippedSample, source_of, worker_count
from . import state as resume
from .iterator import EpochIterator, Skips, check_max_skipped
from .lookahead import predict_next_epoch
from .plan import Unbatched, draw_batches, draws_from_global, tell_sampler
from .processes import Workers
from .ray_workers import RayExecutor, RayWorkers, base_seed
from .starting import fresh_credentials, frozen_heap
from .tuned import Tuned

__all__ = ["ConcurrentDataLoader"]

log = logging.getLogger(__name__)

T_co = TypeVar("T_co", covariant=True)


class ConcurrentDataLoader(DataLoader[T_co]):
    """A ``DataLoader`` that fetches many objects concurrently per worker process.

    Takes every ``DataLoader`` argument with torch's meaning (``num_workers`` also takes
    ``"auto"``: a process per core of ``cpu_budget``), plus how batches are produced (how
    bytes are fetched is the dataset's ``fetch_config``):

    - ``decode_threads``, ``getitem_threads``, ``prefetch_batches``: per process (None or
      ``"auto"``: ``PipelineOptions.derive``, decode threads self-tuned within this process's
      share of ``cpu_budget`` cores, default the CPUs it may use shared among the node's
      ranks);
    - ``seed``: the shuffle seed of all ranks when the loader shards by itself under
      ``torch.distributed`` (no ``sampler`` or ``batch_sampler`` given);
    - ``on_error``: ``"raise"`` (``next()`` raises the failed batch's error, the next call goes
      on) or ``"skip"``, within ``max_skipped`` (a count or a fraction of the epoch's samples);
    - ``log_every_s``: log :meth:`stats` this often; ``stall_timeout_s``: a process waiting
      this long raises ``LoaderStalled`` (None: never);
    - ``executor``: None (batches made by ``num_workers`` local worker processes) or a
      :class:`~.ray_workers.RayExecutor` (made on Ray actors, which live until :meth:`close`).
    """

    def __init__(
        self,
        dataset: Dataset[T_co],
        batch_size: int | None = 1,
        shuffle: bool | None = None,
        sampler: Sampler[Any] | Iterable[Any] | None = None,
        batch_sampler: Sampler[list[Any]] | Iterable[list[Any]] | None = None,
        num_workers: int | str = 0,
        collate_fn: Callable[[list[T_co]], Any] | None = None,
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
        decode_threads: int | str | None = None,
        getitem_threads: int | None = None,
        prefetch_batches: int | str | None = None,
        cpu_budget: float | None = None,
        seed: int = 0,
        on_error: str = "raise",
        max_skipped: int | float = 0.01,
        log_every_s: float | None = None,
        stall_timeout_s: float | None = 300.0,
        executor: RayExecutor | None = None,
    ) -> None:
        check_max_skipped(max_skipped)
        if executor is not None and num_workers:
            raise ConfigError(
                "executor= makes the batches on its Ray actors: leave num_workers at 0 "
                f"(got {num_workers})"
            )
        if executor is not None and isinstance(dataset, IterableDataset):
            raise ConfigError("executor= needs a map-style dataset (batches are planned here)")
        num_workers = worker_count(num_workers, cpu_budget)  # "auto": one per core
        source = source_of(dataset)
        options = PipelineOptions.derive(
            fetch_config=source.fetch_config if source else None,
            batch_size=batch_size or 1,
            num_workers=max(num_workers, 0),
            decode_threads=decode_threads,
            getitem_threads=getitem_threads,
            prefetch_batches=prefetch_batches,
            cpu_budget=cpu_budget,
            on_error=on_error,
            stall_timeout_s=stall_timeout_s,
            parts=getattr(dataset, "parts", None) if source else None,  # checked by the dataset
        )
        super().__init__(
            dataset,
            batch_size=batch_size,
            shuffle=shuffle,
            sampler=sampler,
            batch_sampler=batch_sampler,
            num_workers=num_workers,
            collate_fn=collate_fn,
            pin_memory=pin_memory,
            drop_last=drop_last,
            timeout=timeout,
            worker_init_fn=worker_init_fn,
            multiprocessing_context=multiprocessing_context,
            generator=generator,
            prefetch_factor=prefetch_factor,
            persistent_workers=persistent_workers,
            pin_memory_device=pin_memory_device,
            in_order=in_order,
        )
        # Our own arguments, under their names (frameworks rebuild a loader from them).
        self.decode_threads = decode_threads  # None, "auto": self-tuned
        self.getitem_threads = options.getitem_threads
        self.prefetch_batches = prefetch_batches  # None, "auto": following the fetch limit
        self.cpu_budget = cpu_budget
        self.seed = seed
        self.on_error = on_error
        self.max_skipped = max_skipped
        self.log_every_s = log_every_s
        self.stall_timeout_s = stall_timeout_s
        self.executor = executor
        self.skipped: list[SkippedSample] = []

        self._iterable = isinstance(dataset, IterableDataset)
        # No sampler given: under torch.distributed the loader shards by itself.
        self._shards_itself = sampler is None and batch_sampler is None and not self._iterable
        self._shuffle = bool(shuffle)
        self._epoch = 0
        self._generators = resume.GeneratorStates(generator, sampler, batch_sampler)
        self._shared_stats = SharedStats(executor.actors - 1 if executor else max(num_workers, 0))
        self._options = options
        self._tuned = Tuned(
            options,
            source.fetch_config if source else None,
            self._shared_stats,
            executor.actors if executor else num_workers,
        )
        self._ray_workers: RayWorkers | None = None
        self._waits = StallLedger()
        self._iterating_since: float | None = None
        self._pending_state: dict[str, Any] | None = None
        self._progress: resume.EpochProgress | None = None
        # The inner loader draws its workers' base seed from the state ``generator`` had
        # when this loader drew the same seed.
        self._workers = Workers(dataset, options, self._shared_stats, torch.Generator())

    def set_epoch(self, epoch: int) -> None:
        """Number the next epoch (as ``DistributedSampler.set_epoch``, when the loader shards
        by itself under torch.distributed)."""
        self._epoch = epoch

    def _epoch_sampler(self) -> Iterable[Any]:
        if self._shards_itself:
            # Read at iteration time, not construction: the loader may be built before
            # init_process_group.
            rank, world_size = resume.world()
            if world_size > 1:
                sampler: DistributedSampler[Any] = DistributedSampler(
                    self.dataset,
                    num_replicas=world_size,
                    rank=rank,
                    shuffle=self._shuffle,
                    seed=self.seed,
                    drop_last=self.drop_last,
                )
                sampler.set_epoch(self._epoch)
                if self.batch_size is None:
                    return sampler
                return BatchSampler(sampler, self.batch_size, self.drop_last)
        return self.batch_sampler if self.batch_sampler is not None else self.sampler

    def __len__(self) -> int:
        if self._shards_itself and resume.world()[1] > 1:
            return len(self._epoch_sampler())  # type: ignore[arg-type]
        return super().__len__()

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        if self._iterable:
            return super().__iter__()
        failure: BaseException | None = self._workers.died_between_epochs()
        if failure is None:
            try:
                return self._start_epoch()
            except RuntimeError as exc:
                failure = self._workers.failure(exc, self._workers.processes)
                if failure is exc:
                    raise
        del self  # the traceback keeps this frame: not the loader (and its next workers)
        raise failure

    def _start_epoch(self) -> EpochIterator:
        # A new inner iterator draws its workers' base seed; persistent workers keep theirs.
        new_iterator = not (self.persistent_workers and self._workers.started)
        if self.num_workers > 0 and new_iterator:
            self.check_worker_number_rationality()
        pending, self._pending_state = self._pending_state, None
        self._generators.use_global = self.generator is None and draws_from_global(
            self._epoch_sampler()
        )
        skip = 0
        base_seed_drawn = new_iterator
        if pending is not None:
            self._epoch, skip = resume.restore(pending, self._generators)
            base_seed_drawn = bool(pending.get("base_seed_drawn", False))
        start_state = self._generators.get()
        epoch = self._epoch
        batched = self.batch_sampler is not None  # torch's automatic batching
        tell_sampler(
            self.sampler, self.batch_sampler, num_workers=self.num_workers, in_order=self.in_order
        )
        batches = draw_batches(
            self._epoch_sampler(),
            batched=batched,
            generator=self.generator,
            draw_seed=base_seed_drawn,
            seed_into=self._workers.generator if new_iterator else None,
        )
        collate = self.collate_fn if batched else Unbatched(self.collate_fn)
        self._epoch += 1
        if not 0 <= skip <= len(batches):
            raise ConfigError(
                f"the state resumes after batch {skip}, but this epoch has {len(batches)} batches"
            )
        workers = self._workers
        failure: Callable[[BaseException], BaseException] = _same
        if self.executor is not None:
            # The seed a new inner iterator would have drawn, so either way leaves the
            # generators in the same state (a state taken with one resumes with the other).
            seed = base_seed(workers.generator)
            pin_memory = self.pin_memory and torch.cuda.is_available()
            actors = self._actors(self.executor, collate)
            inner_batches = actors.epoch(batches[skip:], seed, pin_memory)
        else:
            predicted = self._predict_next_epoch()
            starts_workers = self.num_workers > 0 and new_iterator
            if starts_workers:
                fresh_credentials(self.dataset)
            if new_iterator:  # new processes start their self-tuned values where the last ended
                workers.options = self._tuned.next_options()
            inner = workers.inner(self, batches, skip, collate, predicted)
            with warnings.catch_warnings(), frozen_heap() if starts_workers else nullcontext():
                # Said once above, as torch says it once per iterator.
                warnings.filterwarnings("ignore", message="This DataLoader will create")
                inner_batches = iter(inner)
            if self.persistent_workers:
                workers.started = True
            processes = workers.processes
            failure = functools.partial(workers.failure, processes=processes)
        self._iterating_since = self._iterating_since or time.perf_counter()
        self._progress = resume.EpochProgress(
            epoch=epoch,
            generator_states=start_state,
            num_batches=len(batches),
            batches_taken=skip,
            samples=sum(len(b) for b in batches),
            base_seed_drawn=base_seed_drawn,
            done=skip == len(batches),
        )
        skips = Skips(self.on_error, self.max_skipped, self._progress.samples)
        self.skipped = skips.skipped
        return EpochIterator(
            inner_batches,
            self._progress,
            failure=failure,
            skips=skips,
            waits=self._waits,
            pin_memory=self.pin_memory,
            log_every_s=self.log_every_s,
            stats=self.stats,
        )

    def _actors(self, executor: RayExecutor, collate: Callable[[list[Any]], Any]) -> RayWorkers:
        if self._ray_workers is None:
            fresh_credentials(self.dataset)
            self._ray_workers = RayWorkers(
                executor,
                self.dataset,
                collate,
                self._tuned.next_options(),
                self._shared_stats,
                self.worker_init_fn,
            )
        return self._ray_workers

    def close(self) -> None:
        """End the Ray actors this loader made (local workers end with their epoch, or with
        the loader when persistent)."""
        ray_workers, self._ray_workers = self._ray_workers, None
        if ray_workers is not None:
            ray_workers.close()

    def _predict_next_epoch(self) -> list[list[Any]]:
        """The next epoch's batches, for persistent workers to fetch ahead (:mod:`.lookahead`);
        empty when that does not apply or they cannot be predicted."""
        if source_of(self.dataset) is None or not (self.persistent_workers and self.in_order):
            return []
        sampler = self._epoch_sampler()  # the next epoch's: the epoch number is counted
        return predict_next_epoch(
            sampler,
            batched=self.batch_sampler is not None,
            users=sampler is self.sampler or sampler is self.batch_sampler,
            generators=self._generators,
        )

    def state_dict(self) -> dict[str, Any]:
        """Where this loader is in its epochs (torchdata's protocol): a loader that loads it
        continues with the next batch the consumer has not received, or the next epoch."""
        if self._iterable:
            raise ConfigError(
                "exact resume needs a map-style dataset (an IterableDataset keeps its own place)"
            )
        if not self.in_order and self.num_workers > 0:
            raise ConfigError("exact resume needs in_order=True (batches in sampler order)")
        state = resume.make_state(
            self._progress,
            self._epoch,
            self._generators,
            next_draws_base_seed=not (self.persistent_workers and self._workers.started),
        )
        return state | {"tuning": self._tuned.state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from ``state`` at the next ``iter(loader)``."""
        resume.check_version(state)
        self._tuned.load(state)
        self._pending_state = dict(state)

    @property
    def tuning(self) -> dict[str, Any]:
        """The choices in force per process (self-tuned ones as the mean over processes):
        requests in flight, decode threads (and their most), batches in progress (at least;
        more while following a growing fetch limit); and the shares of fetch slots and
        decode threads busy so far."""
        source = source_of(self.dataset)
        pinned = source.fetch_config.max_inflight_requests if source else None
        stats = self.stats()
        return {
            "max_inflight_requests": pinned or self._tuned.inflight_limit(),
            "decode_threads": self._tuned.decode_threads(),
            "max_decode_threads": self._options.max_decode_threads,
            "prefetch_batches": self._options.prefetch_batches,
            "follows_fetch_limit": self._options.follow_limit,
            "busy": stats["busy"],
        }

    def stats(self) -> dict[str, Any]:
        """Loader metrics merged over every process (see ``README``); ``verdict`` names the
        bottleneck."""
        elapsed = time.perf_counter() - self._iterating_since if self._iterating_since else 0.0
        total = self._shared_stats.total()
        fetch_slots, decode_slots = self._tuned.slots()  # self-tuned ones move
        return loader_stats(
            total,
            self._waits,
            elapsed=elapsed,
            fetch_slots=fetch_slots,
            decode_slots=decode_slots,
            actors=self.executor.actors if self.executor else None,
        )


def _same(exc: BaseException) -> BaseException:
    return exc
