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

Because the epoch's plan is drawn in the main process, resuming mid-epoch is exact: the
state records the epoch, the sampler's random state at the epoch's start and how many
batches the consumer took; a resumed loader redraws the same plan and skips that many.
"""

from __future__ import annotations

import logging
import os
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
    get_worker_info,
)

from .dataset import ObjectDataset
from .errors import ConfigError, Reason, SkipBudgetExceeded, WorkerError
from .pipeline import BatchPipeline, Partial, SkippedSample
from .stats import SharedStats, StageStats, percentile

__all__ = ["ConcurrentDataLoader", "PartialBatch", "PartialDict", "PartialList", "is_partial"]

_STATE_VERSION = 1


class PartialBatch(tuple[Any, ...]):
    """A tuple batch that lost samples under ``on_error="skip"``; see ``.skipped``."""

    skipped: list[SkippedSample]


class PartialList(list[Any]):
    """A list batch that lost samples under ``on_error="skip"``; see ``.skipped``."""

    skipped: list[SkippedSample]


class PartialDict(dict[Any, Any]):
    """A dict batch that lost samples under ``on_error="skip"``; see ``.skipped``."""

    skipped: list[SkippedSample]


_MARKED: dict[type, type] = {tuple: PartialBatch, list: PartialList, dict: PartialDict}


def _partial(kind: type, batch: Any, skipped: list[SkippedSample]) -> Any:
    marked = _MARKED[kind](batch)
    marked.skipped = skipped
    return marked


def _mark(batch: Any, skipped: list[SkippedSample]) -> Any:
    for kind in (tuple, list, dict):
        if isinstance(batch, kind):
            return _partial(kind, batch, skipped)
    if isinstance(batch, torch.Tensor):
        batch.skipped = skipped  # type: ignore[attr-defined]
        return batch
    raise TypeError(
        f"on_error='skip' needs batches that can be marked (tuple, list, dict or tensor), "
        f"got {type(batch).__name__}"
    )


def _pin(batch: Any) -> Any:
    if isinstance(batch, torch.Tensor):
        return batch.pin_memory()
    if isinstance(batch, (tuple, list)):
        return type(batch)(_pin(item) for item in batch)
    if isinstance(batch, dict):
        return {key: _pin(value) for key, value in batch.items()}
    return batch


def is_partial(batch: Any) -> bool:
    """True if ``batch`` lost samples under ``on_error="skip"`` (its ``.skipped`` says which)."""
    return bool(getattr(batch, "skipped", None))


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

    ``indices[offsets[b]:offsets[b+1]]`` is batch ``b``; ``count[0]`` batches are valid.
    """

    def __init__(self) -> None:
        self.count = torch.zeros(1, dtype=torch.int64).share_memory_()
        self.indices = torch.zeros(0, dtype=torch.int64).share_memory_()
        self.offsets = torch.zeros(1, dtype=torch.int64).share_memory_()

    def write(
        self,
        batches: Sequence[Sequence[int]],
        *,
        may_grow: bool,
        room: tuple[int, int] = (0, 0),
    ) -> None:
        """Write ``batches``; when buffers are (re)made, size them for at least ``room``
        (samples, batches): a resumed epoch writes only its rest, later epochs all of it."""
        flat = [int(i) for batch in batches for i in batch]
        if len(flat) > self.indices.numel() or len(batches) + 1 > self.offsets.numel():
            if not may_grow:
                raise ConfigError(
                    "the sampler yields more samples this epoch than in the first one, which "
                    "persistent_workers=True cannot take: use persistent_workers=False"
                )
            samples, count = max(len(flat), room[0]), max(len(batches), room[1])
            self.indices = torch.zeros(samples, dtype=torch.int64).share_memory_()
            self.offsets = torch.zeros(count + 1, dtype=torch.int64).share_memory_()
        sizes = torch.tensor([len(b) for b in batches], dtype=torch.int64)
        self.offsets[0] = 0
        torch.cumsum(sizes, 0, out=self.offsets[1 : len(batches) + 1])
        self.indices[: len(flat)] = torch.tensor(flat, dtype=torch.int64)
        self.count[0] = len(batches)

    def batches_for(self, worker: int, num_workers: int) -> list[list[int]]:
        count = int(self.count[0])
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
        shared = self.shared_stats
        shared.register(row)
        pipeline: BatchPipeline | None = None
        try:
            pipeline = BatchPipeline(
                self.dataset,
                batches,
                collate_fn=self.collate_fn,
                # Counting goes on from what earlier epochs (or processes) left in the row.
                stats=shared.read(row),
                publish=lambda stats: shared.write(row, stats),
                **self.options,
            )
            yield from pipeline
        except Exception as exc:
            if info is None:
                raise
            # Hand the exception itself to the main process: torch would re-create it from
            # its message alone and lose its attributes.
            yield _Failure(exc)
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


class ConcurrentDataLoader(DataLoader[Any]):
    """A ``DataLoader`` that fetches many objects concurrently per worker process.

    Takes every ``torch.utils.data.DataLoader`` argument with the same meaning, plus:

    - ``max_inflight_requests``: GETs in flight at most per process (default: the dataset's
      ``FetchConfig.max_inflight_requests``, 64; for other datasets, threads calling
      ``__getitem__``);
    - ``max_inflight_bytes``: fetched-but-undecoded bytes held at most per process;
    - ``decode_threads``: decode threads per process (default: the process's share of CPUs);
    - ``prefetch_batches``: batches in progress per process ahead of the consumer (default:
      enough to keep ``max_inflight_requests`` busy, at least 2);
    - ``seed``: the shuffle seed shared by all ranks under ``torch.distributed``;
    - ``on_error``: ``"raise"`` (default) or ``"skip"``, with ``max_skipped`` (a count, or a
      fraction of the epoch's samples) before ``SkipBudgetExceeded``;
    - ``log_every_s``: log :meth:`stats` as one INFO line this often (off by default).

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
        prefetch_batches: int | None = None,
        seed: int = 0,
        on_error: str = "raise",
        max_skipped: int | float = 0.01,
        log_every_s: float | None = None,
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
        if max_inflight_requests is None:
            max_inflight_requests = (
                dataset.fetch_config.max_inflight_requests
                if isinstance(dataset, ObjectDataset)
                else 64
            )
        if max_inflight_requests < 1:
            raise ConfigError(f"max_inflight_requests must be >= 1, got {max_inflight_requests}")
        if decode_threads is not None and decode_threads < 1:
            raise ConfigError(f"decode_threads must be >= 1, got {decode_threads}")
        if prefetch_batches is not None and prefetch_batches < 1:
            raise ConfigError(f"prefetch_batches must be >= 1, got {prefetch_batches}")
        if on_error not in ("raise", "skip"):
            raise ConfigError(f"on_error must be 'raise' or 'skip', got {on_error!r}")
        if isinstance(max_skipped, float) and not 0 <= max_skipped < 1:
            raise ConfigError(f"max_skipped as a fraction must be in [0, 1), got {max_skipped}")
        if isinstance(max_skipped, int) and max_skipped < 0:
            raise ConfigError(f"max_skipped must be >= 0, got {max_skipped}")

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
        self._shared_stats = SharedStats(num_workers)
        self._planned = _PlannedBatches(
            dataset,
            self._plan,
            batch_collate,
            {
                "max_inflight_requests": max_inflight_requests,
                "max_inflight_bytes": max_inflight_bytes,
                "decode_threads": decode_threads,
                "prefetch_batches": prefetch_batches,
                "on_error": on_error,
            },
            self._shared_stats,
        )
        self.on_error = on_error
        self.max_skipped = max_skipped
        self.log_every_s = log_every_s
        self.skipped: list[SkippedSample] = []
        self._waits = StageStats()
        self._iterating_since: float | None = None
        self._startup_wait = 0.0
        self._pending_state: dict[str, Any] | None = None
        self._progress: dict[str, Any] | None = None
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
        skip = 0
        state, self._pending_state = self._pending_state, None
        if state is not None:
            skip = self._restore(state)
        start_state = self._generator_states()
        epoch = self._epoch
        batches = [list(b) for b in self._index_batches()]
        self._epoch += 1
        if not 0 <= skip <= len(batches):
            raise ConfigError(
                f"the state resumes after batch {skip}, but this epoch has {len(batches)} batches"
            )
        may_grow = not (self.persistent_workers and self._plan_written)
        samples = sum(len(b) for b in batches)
        self._plan.write(batches[skip:], may_grow=may_grow, room=(samples, len(batches)))
        self._plan_written = True
        self.skipped = []
        self._progress = {
            "epoch": epoch,
            "generator_states": start_state,
            "num_batches": len(batches),
            "batches_taken": skip,
            "samples": samples,
            "done": skip == len(batches),
        }
        return self._consume(super().__iter__(), self._progress)

    def _consume(self, batches: Iterator[Any], progress: dict[str, Any]) -> Iterator[Any]:
        """Re-raise workers' errors, apply the skip policy, count progress and waits."""
        failure: BaseException | None = None
        self._iterating_since = self._iterating_since or time.perf_counter()
        last_log = time.monotonic()
        budget = self._skip_budget(progress["samples"])
        first_batch = progress["batches_taken"]
        try:
            while True:
                waited = time.perf_counter()
                try:
                    batch = next(batches)
                except StopIteration:
                    break
                except Exception as exc:
                    # Raised inside torch's iterator: the tracebacks of the error and of its
                    # causes hold the iterator (and so the worker processes) alive for as long
                    # as the caller keeps the error.
                    _drop_tracebacks(exc)
                    failure = exc
                    dead = self._shared_stats.dead_workers()
                    if isinstance(exc, RuntimeError) and dead:
                        failure = WorkerError(
                            f"loader worker process(es) {dead} died without raising (killed by "
                            "the OS, e.g. out of memory?)",
                            stage="worker",
                            cause=Reason.WORKER_DIED,
                        )
                        failure.__cause__ = exc
                    break
                seconds = time.perf_counter() - waited
                self._waits.add_wait(seconds)
                if progress["batches_taken"] == first_batch:
                    self._startup_wait += seconds
                if isinstance(batch, _Failure):
                    failure = batch.exc
                    break
                progress["batches_taken"] += 1
                if isinstance(batch, Partial):
                    for sample in batch.skipped:
                        log.warning("skipped %s: %s", sample.url, sample.error)
                    self.skipped.extend(batch.skipped)
                    if len(self.skipped) > budget:
                        last = batch.skipped[-1]
                        failure = SkipBudgetExceeded(
                            f"{len(self.skipped)} samples skipped this epoch, more than "
                            f"max_skipped={self.max_skipped!r} allows ({budget})",
                            url=last.url,
                            cause=Reason.SKIP_BUDGET_EXCEEDED,
                        )
                        failure.__cause__ = last.error
                        break
                    if batch.batch is None:
                        continue  # every sample of it failed: counted and logged above
                    contents = batch.batch
                    if self.pin_memory and torch.cuda.is_available():
                        # torch's pin thread passed this wrapper through unpinned.
                        contents = _pin(contents)
                    batch = _mark(contents, batch.skipped)
                if self.log_every_s is not None and time.monotonic() - last_log >= self.log_every_s:
                    last_log = time.monotonic()
                    log.info("%s", _format_stats(self.stats()))
                yield batch
            progress["done"] = failure is None
        finally:
            # Drop torch's iterator before raising so its workers shut down now, not
            # whenever the traceback (which keeps this frame alive) is collected.
            del batches
        if failure is not None:
            raise failure

    def _skip_budget(self, samples: int) -> float:
        if self.on_error != "skip":
            return float("inf")
        if isinstance(self.max_skipped, float):
            return self.max_skipped * samples
        return float(self.max_skipped)

    # ------------------------------------------------------------------ resumable state

    def _generator_states(self) -> dict[str, torch.Tensor]:
        states = {}
        if self._generator is not None:
            states["loader"] = self._generator.get_state()
        sampler_generator = getattr(self._user_sampler, "generator", None)
        if isinstance(sampler_generator, torch.Generator):
            states["sampler"] = sampler_generator.get_state()
        return states

    def _world(self) -> tuple[int, int]:
        if dist.is_available() and dist.is_initialized():
            return dist.get_rank(), dist.get_world_size()
        return 0, 1

    def state_dict(self) -> dict[str, Any]:
        """Where this loader is in its epochs, to resume exactly (torchdata's protocol).

        Taken mid-epoch, a loader that loads it continues with the next batch the consumer
        has not received; taken between epochs, with the next epoch.
        """
        if not self.in_order:
            raise ConfigError("exact resume needs in_order=True (batches in sampler order)")
        rank, world = self._world()
        progress = self._progress
        if progress is None or progress["done"]:
            return {
                "version": _STATE_VERSION,
                "epoch": self._epoch,
                "batches_taken": 0,
                "generator_states": self._generator_states(),
                "rank": rank,
                "world_size": world,
            }
        return {
            "version": _STATE_VERSION,
            "epoch": progress["epoch"],
            "batches_taken": progress["batches_taken"],
            "generator_states": progress["generator_states"],
            "rank": rank,
            "world_size": world,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from ``state`` at the next ``iter(loader)``."""
        if state.get("version") != _STATE_VERSION:
            raise ConfigError(f"unknown loader state version {state.get('version')!r}")
        self._pending_state = dict(state)

    def _restore(self, state: dict[str, Any]) -> int:
        rank, world = self._world()
        if (state["rank"], state["world_size"]) != (rank, world):
            raise ConfigError(
                f"the state was saved by rank {state['rank']} of {state['world_size']}, but this "
                f"is rank {rank} of {world}: resuming with a different world size (or rank) is "
                "not supported"
            )
        self._epoch = int(state["epoch"])
        states = state["generator_states"]
        if "loader" in states and self._generator is not None:
            self._generator.set_state(states["loader"])
        sampler_generator = getattr(self._user_sampler, "generator", None)
        if "sampler" in states and isinstance(sampler_generator, torch.Generator):
            sampler_generator.set_state(states["sampler"])
        return int(state["batches_taken"])

    # ------------------------------------------------------------------ live metrics

    def stats(self) -> dict[str, Any]:
        """Loader metrics merged over every process: see :func:`_format_stats` for a line."""
        total = self._shared_stats.total()
        waits = self._waits.histogram("wait")
        elapsed = time.perf_counter() - self._iterating_since if self._iterating_since else 0.0
        fetch, decode = total["fetch"], total["decode"]
        processes = max(1, self.num_workers)
        out: dict[str, Any] = {
            "requests": int(total["objects"]),
            "bytes": int(total["bytes"]),
            "retries": int(total["retries"]),
            "throttles": int(total["throttles"]),
            "skipped": int(total["skipped"]),
            "inflight": int(total["inflight"]),
            "batches": int(waits["count"]),
            "elapsed_s": elapsed,
            "get_latency_s": _percentiles(fetch["counts"]),
            "first_byte_s": _percentiles(total["first_byte"]["counts"]),
            "decode_s_per_image": decode["total"] / decode["count"] if decode["count"] else None,
            "wait_s_per_batch": _percentiles(waits["counts"]),
            "bytes_per_s": total["bytes"] / elapsed if elapsed else 0.0,
            "images_per_s": decode["count"] / elapsed if elapsed else 0.0,
        }
        # The first batch of an epoch always waits for the pipeline to fill: judge the
        # steady state.
        steady = elapsed - self._startup_wait
        out["verdict"] = _verdict(
            wait_share=(waits["total"] - self._startup_wait) / steady if steady > 0 else 0.0,
            fetch_busy=fetch["total"] / elapsed / (self.max_inflight_requests * processes)
            if elapsed
            else 0.0,
            decode_busy=decode["total"] / elapsed / (self.decode_threads * processes)
            if elapsed
            else 0.0,
        )
        return out

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


def _percentiles(counts: list[float]) -> dict[str, float | None]:
    return {f"p{q}": percentile(counts, q) for q in (50, 95, 99)}


def _verdict(*, wait_share: float, fetch_busy: float, decode_busy: float) -> str:
    """Which stage limits throughput, from the consumer's waiting share and how busy the
    fetch slots (GETs in flight / allowed) and decode threads were."""
    if wait_share < 0.1:
        return f"training step: the loader keeps up (the loop waited {wait_share:.0%} of the time)"
    if max(fetch_busy, decode_busy) < 0.5:
        return (
            f"loader: the loop waited {wait_share:.0%} of the time, yet fetch slots were only "
            f"{fetch_busy:.0%} and decode threads {decode_busy:.0%} busy; raise "
            "prefetch_batches or num_workers"
        )
    if fetch_busy >= decode_busy:
        return (
            f"storage: the loop waited {wait_share:.0%} of the time and fetch slots were "
            f"{fetch_busy:.0%} busy; raise max_inflight_requests or num_workers"
        )
    return (
        f"decode: the loop waited {wait_share:.0%} of the time and decode threads were "
        f"{decode_busy:.0%} busy; raise num_workers or decode_threads, or use image_size"
    )


def _format_stats(stats: dict[str, Any]) -> str:
    p50 = stats["get_latency_s"]["p50"]
    return (
        f"{stats['images_per_s']:.0f} img/s, {stats['bytes_per_s'] / 1e6:.1f} MB/s, "
        f"GET p50 {p50 * 1000 if p50 else 0:.1f} ms, {stats['inflight']} in flight, "
        f"{stats['retries']} retries, {stats['throttles']} throttles, "
        f"{stats['skipped']} skipped - {stats['verdict']}"
    )


def _available_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1
