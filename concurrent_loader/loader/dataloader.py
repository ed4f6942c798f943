"""``ConcurrentDataLoader``: a ``torch.utils.data.DataLoader`` whose workers keep many
requests in flight, pipelined across batches.

How it stays on public PyTorch API: at the start of each epoch the main process draws the
epoch's batches from the (batch) sampler, as a stock DataLoader would, and writes them to a
shared-memory :class:`~.plan.EpochPlan`. The DataLoader it hands to ``torch`` iterates an
``IterableDataset`` (:class:`~.worker.PlannedBatches`): worker ``w`` of ``W`` produces
batches ``w, w+W, w+2W, ...`` of the plan through a
:class:`~concurrent_loader.pipeline.BatchPipeline`, and torch's in-order round-robin over
workers returns them as batches ``0, 1, 2, ...``. So batch ``i`` holds exactly the sampler's
batch ``i``, every start method works (workers need only the picklable dataset and the
shared plan), and ``pin_memory``, ``timeout``, ``worker_init_fn``, ``persistent_workers``
and ``prefetch_factor`` keep their torch meaning.

This module holds the arguments and the iteration; the plan (:mod:`.plan`), resumable state
(:mod:`.state`), skip marking (:mod:`.partial`) and metrics (:mod:`concurrent_loader.metrics`)
live beside it.
"""

from __future__ import annotations

import logging
import time
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
)

from ..errors import ConfigError, Reason, SkipBudgetExceeded, WorkerError
from ..metrics import SharedStats, StallLedger, format_stats, loader_stats
from ..pipeline import Partial, PipelineOptions, SkippedSample, source_of
from . import state as resume
from .partial import mark, pin
from .plan import EpochPlan
from .worker import Failure, PlannedBatches

__all__ = ["ConcurrentDataLoader"]

log = logging.getLogger(__name__)


def _passthrough(batch: Any) -> Any:
    return batch


class _Unbatched:
    """Collate for ``batch_size=None``: each "batch" is one sample, converted as torch does."""

    def __init__(self, convert: Callable[[Any], Any]) -> None:
        self.convert = convert

    def __call__(self, items: list[Any]) -> Any:
        return self.convert(items[0])


class ConcurrentDataLoader(DataLoader[Any]):
    """A ``DataLoader`` that fetches many objects concurrently per worker process.

    Takes every ``torch.utils.data.DataLoader`` argument with the same meaning, plus (see
    :class:`~concurrent_loader.pipeline.PipelineOptions`):

    - ``max_inflight_requests``: GETs in flight at most per process (default: the dataset's
      ``FetchConfig.max_inflight_requests``, 64);
    - ``max_inflight_bytes``: fetched-but-undecoded bytes held at most per process;
    - ``decode_threads``: decode threads per process (default: the process's share of CPUs);
    - ``getitem_threads``: threads per process calling ``__getitem__`` of a dataset that is
      not ours (default 64);
    - ``prefetch_batches``: batches in progress per process ahead of the consumer (default:
      enough to keep ``max_inflight_requests`` busy, at least 2);
    - ``seed``: the shuffle seed shared by all ranks under ``torch.distributed``;
    - ``on_error``: ``"raise"`` (default) or ``"skip"``, with ``max_skipped`` (a count, or a
      fraction of the epoch's samples) before ``SkipBudgetExceeded``;
    - ``log_every_s``: log :meth:`stats` as one INFO line this often (off by default);
    - ``stall_timeout_s``: a process that waits this long for a batch raises
      ``LoaderStalled`` naming what it waited on, with every thread's stack (default 300 s;
      None: never); it logs a WARNING before.

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
        max_inflight_requests: int | None = None,
        max_inflight_bytes: int | None = None,
        decode_threads: int | None = None,
        getitem_threads: int | None = None,
        prefetch_batches: int | None = None,
        seed: int = 0,
        on_error: str = "raise",
        max_skipped: int | float = 0.01,
        log_every_s: float | None = None,
        stall_timeout_s: float | None = 300.0,
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
        if isinstance(max_skipped, float) and not 0 <= max_skipped < 1:
            raise ConfigError(
                f"max_skipped as a fraction must be in [0, 1), got {max_skipped}",
                cause=Reason.INVALID_ARGUMENT,
            )
        if isinstance(max_skipped, int) and max_skipped < 0:
            raise ConfigError(
                f"max_skipped must be >= 0, got {max_skipped}", cause=Reason.INVALID_ARGUMENT
            )
        source = source_of(dataset)
        options = PipelineOptions.derive(
            inflight_default=source.fetch_config.max_inflight_requests if source else 64,
            batch_size=batch_size or 1,
            num_workers=num_workers,
            max_inflight_requests=max_inflight_requests,
            max_inflight_bytes=max_inflight_bytes,
            decode_threads=decode_threads,
            getitem_threads=getitem_threads,
            prefetch_batches=prefetch_batches,
            on_error=on_error,
            stall_timeout_s=stall_timeout_s,
        )

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
        self._generator = generator
        self._generators = resume.GeneratorStates(generator, sampler)

        if batch_size is None and batch_sampler is None:
            batch_collate: Callable[[list[Any]], Any] = _Unbatched(collate_fn or default_convert)
        else:
            batch_collate = collate_fn or default_collate
        self._plan = EpochPlan()
        self._shared_stats = SharedStats(num_workers)
        self._planned = PlannedBatches(
            dataset, self._plan, batch_collate, options, self._shared_stats
        )
        self.options = options
        self.on_error = on_error
        self.max_skipped = max_skipped
        self.log_every_s = log_every_s
        self.skipped: list[SkippedSample] = []
        self._waits = StallLedger()
        self._iterating_since: float | None = None
        self._pending_state: dict[str, Any] | None = None
        self._progress: resume.EpochProgress | None = None
        self.max_inflight_requests = max_inflight_requests or (
            source.fetch_config.max_inflight_requests if source else None
        )
        self.decode_threads = options.decode_threads
        self.prefetch_batches = options.prefetch_batches
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
        skip = 0
        pending, self._pending_state = self._pending_state, None
        if pending is not None:
            self._epoch, skip = resume.restore(pending, self._generators)
        start_state = self._generators.get()
        epoch = self._epoch
        batches = [list(b) for b in self._index_batches()]
        self._epoch += 1
        if not 0 <= skip <= len(batches):
            raise ConfigError(
                f"the state resumes after batch {skip}, but this epoch has {len(batches)} batches",
                cause=Reason.INVALID_ARGUMENT,
            )
        may_grow = not (self.persistent_workers and self._plan_written)
        samples = sum(len(b) for b in batches)
        self._plan.write(batches[skip:], may_grow=may_grow, room=(samples, len(batches)))
        self._plan_written = True
        self.skipped = []
        self._progress = resume.EpochProgress(
            epoch=epoch,
            generator_states=start_state,
            num_batches=len(batches),
            batches_taken=skip,
            samples=samples,
            done=skip == len(batches),
        )
        return self._consume(super().__iter__(), self._progress)

    def _consume(self, batches: Iterator[Any], progress: resume.EpochProgress) -> Iterator[Any]:
        """Re-raise workers' errors, apply the skip policy, count progress and waits."""
        failure: BaseException | None = None
        self._iterating_since = self._iterating_since or time.perf_counter()
        last_log = time.monotonic()
        budget = self._skip_budget(progress.samples)
        first_batch = progress.batches_taken
        returned: float | None = None  # when the last batch was handed to the loop
        try:
            while True:
                asked = time.perf_counter()
                try:
                    batch = next(batches)
                except StopIteration:
                    break
                except Exception as exc:
                    failure = self._worker_failure(exc)
                    break
                got = time.perf_counter()
                # The first batch of an epoch waits for the pipeline to fill: the verdict
                # judges the steady state.
                self._waits.record(
                    got - asked,
                    asked - returned if returned is not None else 0.0,
                    warmup=progress.batches_taken == first_batch,
                )
                if isinstance(batch, Failure):
                    failure = batch.exc
                    break
                progress.batches_taken += 1
                if isinstance(batch, Partial):
                    failure = self._note_skipped(batch, budget)
                    if failure is not None:
                        break
                    if batch.batch is None:
                        continue  # every sample of it failed: counted and logged
                    contents = batch.batch
                    if self.pin_memory and torch.cuda.is_available():
                        # torch's pin thread passed this wrapper through unpinned.
                        contents = pin(contents)
                    batch = mark(contents, batch.skipped)
                if self.log_every_s is not None and time.monotonic() - last_log >= self.log_every_s:
                    last_log = time.monotonic()
                    log.info("%s", format_stats(self.stats()))
                returned = time.perf_counter()
                yield batch
            progress.done = failure is None
        finally:
            # Drop torch's iterator before raising so its workers shut down now, not
            # whenever the traceback (which keeps this frame alive) is collected.
            del batches
        if failure is not None:
            raise failure

    def _worker_failure(self, exc: Exception) -> BaseException:
        """The error to raise for ``exc``, raised inside torch's iterator."""
        # The tracebacks of the error and of its causes hold the iterator (and so the
        # worker processes) alive for as long as the caller keeps the error.
        _drop_tracebacks(exc)
        dead = self._shared_stats.dead_workers()
        if isinstance(exc, RuntimeError) and dead:
            failure = WorkerError(
                f"loader worker process(es) {dead} died without raising (killed by "
                "the OS, e.g. out of memory?)",
                stage="worker",
                cause=Reason.WORKER_DIED,
            )
            failure.__cause__ = exc
            return failure
        return exc

    def _note_skipped(self, batch: Partial, budget: float) -> BaseException | None:
        """Log and list what ``batch`` lost; the error to raise if over the budget."""
        for sample in batch.skipped:
            log.warning("skipped %s: %s", sample.url, sample.error)
        self.skipped.extend(batch.skipped)
        if len(self.skipped) <= budget:
            return None
        last = batch.skipped[-1]
        failure = SkipBudgetExceeded(
            f"{len(self.skipped)} samples skipped this epoch, more than "
            f"max_skipped={self.max_skipped!r} allows ({budget})",
            url=last.url,
            cause=Reason.SKIP_BUDGET_EXCEEDED,
        )
        failure.__cause__ = last.error
        return failure

    def _skip_budget(self, samples: int) -> float:
        if self.on_error != "skip":
            return float("inf")
        if isinstance(self.max_skipped, float):
            return self.max_skipped * samples
        return float(self.max_skipped)

    # ------------------------------------------------------------------ resumable state

    def state_dict(self) -> dict[str, Any]:
        """Where this loader is in its epochs, to resume exactly (torchdata's protocol).

        Taken mid-epoch, a loader that loads it continues with the next batch the consumer
        has not received; taken between epochs, with the next epoch.
        """
        if not self.in_order:
            raise ConfigError(
                "exact resume needs in_order=True (batches in sampler order)",
                cause=Reason.INVALID_ARGUMENT,
            )
        return resume.make_state(self._progress, self._epoch, self._generators)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from ``state`` at the next ``iter(loader)``."""
        resume.check_version(state)
        self._pending_state = dict(state)

    # ------------------------------------------------------------------ live metrics

    def stats(self) -> dict[str, Any]:
        """Loader metrics merged over every process (see ``README``); ``verdict`` names the
        bottleneck."""
        elapsed = time.perf_counter() - self._iterating_since if self._iterating_since else 0.0
        processes = max(1, self.num_workers)
        return loader_stats(
            self._shared_stats.total(),
            self._waits,
            elapsed=elapsed,
            fetch_slots=(self.max_inflight_requests or self.options.getitem_threads) * processes,
            decode_slots=self.decode_threads * processes,
        )

    # ------------------------------------------------------------------ introspection

    @property
    def source_dataset(self) -> Dataset[Any]:
        """The dataset this loader was given."""
        return self._source


def _drop_tracebacks(exc: BaseException | None) -> None:
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        exc.__traceback__ = None
        if exc.__context__ is not None and exc.__context__ is not exc.__cause__:
            _drop_tracebacks(exc.__context__)
        exc = exc.__cause__
