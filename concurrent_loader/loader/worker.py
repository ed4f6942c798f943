"""What the inner DataLoader iterates: each process's batches of the epoch's plan, produced
by a :class:`~concurrent_loader.pipeline.BatchPipeline`.

:class:`PlannedBatches` is an ``IterableDataset`` to torch and the user's dataset to everyone
else (attributes, ``len``, ``[]``, ``__class__``), as ``get_worker_info().dataset``. Every
batch of a share has exactly one outcome: the batch, or a ``Failure`` carrying the original
exception. A persistent worker keeps its pipeline across epochs (:class:`~.lookahead.Lookahead`).
"""

from __future__ import annotations

import functools
import multiprocessing.util
import os
import signal
import traceback
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from torch.utils.data import Dataset, IterableDataset, get_worker_info

from ..errors import LoaderError
from ..metrics import SharedStats
from ..pipeline import BatchPipeline, Failure, PipelineOptions, source_of
from ..runtime import Runtime, acquire_runtime
from .lookahead import Lookahead
from .plan import EpochPlan, Lock

__all__ = ["Failure", "Planned", "PlannedBatches"]

# A worker process keeps one runtime lease for its whole life, so a persistent worker keeps
# its event loop, fetch clients and open connections from one epoch to the next instead of
# closing them when each epoch's pipeline closes. The process's exit ends them.
_process_lease: Runtime | None = None


def _hold_runtime_for_this_process() -> None:
    global _process_lease
    if _process_lease is None or _process_lease.pid != os.getpid():
        _process_lease = acquire_runtime()


def _leave_ctrl_c_to_the_main_process() -> None:
    # Unless worker_init_fn set its own handler: on Ctrl-C torch's worker would exit waiting
    # for its queue's feeder thread to write into a pipe the main process no longer reads,
    # holding the main process up 5 s. Left running, it ends with the main process's iterator.
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, signal.SIG_IGN)


# This worker process's next-epoch prefetch (persistent workers), closed at the process's end.
_ahead: tuple[int, Lookahead] | None = None


def _lookahead() -> Lookahead:
    global _ahead
    if _ahead is None or _ahead[0] != os.getpid():
        ahead = Lookahead()
        _ahead = (os.getpid(), ahead)
        # multiprocessing runs this as the worker process ends (atexit does not run there).
        multiprocessing.util.Finalize(None, ahead.close, exitpriority=10)
    return _ahead[1]


@dataclass
class Planned:
    """What the workers need: the user's dataset, the plan (and the predicted next one, for
    persistent workers), and how batches are made and counted."""

    dataset: Dataset[Any]
    plan: EpochPlan
    collate_fn: Callable[[list[Any]], Any]
    options: PipelineOptions
    stats: SharedStats
    claims: Lock | None = None
    next_plan: EpochPlan | None = None


class PlannedBatches(IterableDataset[Any]):
    """Worker ``w`` of ``W`` yields its batches of the plan, collated, in order: batches
    ``w, w+W, ...`` (a fixed share), or, given ``claims`` (a lock), the batches it claims.
    In the main process (no workers) it yields every batch."""

    def __init__(self, planned: Planned) -> None:
        object.__setattr__(self, "_cl", planned)

    @property  # type: ignore[misc]
    def __class__(self) -> type:
        return type(self._cl.dataset)

    def __getattr__(self, name: str) -> Any:
        if name == "_cl":  # not set yet
            raise AttributeError(name)
        return getattr(self._cl.dataset, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._cl.dataset, name, value)

    def __delattr__(self, name: str) -> None:
        delattr(self._cl.dataset, name)

    def __len__(self) -> int:
        return len(self._cl.dataset)

    def __getitem__(self, index: Any) -> Any:
        return self._cl.dataset[index]

    def __repr__(self) -> str:
        return repr(self._cl.dataset)

    def __reduce__(self) -> tuple[Any, ...]:
        # ``__class__`` names the user's class: pickle this one explicitly.
        return (PlannedBatches, (self._cl,))

    def __iter__(self) -> Iterator[Any]:
        info = get_worker_info()
        worker, num_workers = (info.id, info.num_workers) if info is not None else (0, 1)
        in_worker, row = info is not None, worker + 1 if info is not None else 0
        planned = self._cl
        plan, claims = planned.plan, planned.claims
        # Read now, not when the generator first runs: the main process may write the next
        # epoch's plan meanwhile.
        batches = plan.batches()
        if in_worker:
            _leave_ctrl_c_to_the_main_process()
        if claims is not None:
            claim = functools.partial(plan.claim, claims, plan.generation)
            claimed = (batches[b] for b in iter(claim, None))
            return self._produce(claimed, None, in_worker, row)
        share = batches[worker::num_workers]
        predicted: list[list[Any]] = []
        if in_worker and planned.next_plan is not None:
            # Written with this epoch's plan, before the epoch started: read it now too.
            predicted = planned.next_plan.batches()[worker::num_workers]
        return self._produce(share, predicted, in_worker, row)

    def _start(self, feed: Iterable[list[Any]], row: int) -> BatchPipeline:
        planned = self._cl
        shared = planned.stats
        return BatchPipeline(
            planned.dataset,
            feed,
            collate_fn=planned.collate_fn,
            options=planned.options,
            # Counting goes on from what earlier epochs (or processes) left in the row.
            stats=shared.read(row),
            publish=lambda stats: shared.write(row, stats),
        )

    def _produce(
        self,
        share: Iterable[list[Any]],
        predicted: list[list[Any]] | None,
        in_worker: bool,
        row: int,
    ) -> Iterator[Any]:
        """The outcomes of ``share``: a list (a fixed share, with the ``predicted`` share of the
        next epoch to fetch ahead) or the batches claimed one by one (``predicted`` None)."""
        source = source_of(self._cl.dataset)
        pipeline: BatchPipeline | None = None
        broken: BaseException | None = None
        try:
            if in_worker and source is not None and source.store.capabilities.remote:
                _hold_runtime_for_this_process()
            outcomes: Iterator[Any]
            if predicted is None:
                pipeline = self._start(share, row)
                outcomes = pipeline.outcomes()
            else:
                assert isinstance(share, list)
                start = functools.partial(self._start, row=row)
                # Only our sources' batches are fetched ahead: a foreign ``__getitem__`` may
                # have side effects (and draw random numbers) for batches never delivered.
                if in_worker and self._cl.next_plan is not None and source is not None:
                    outcomes = _lookahead().epoch(share, predicted, start)
                else:
                    outcomes = Lookahead().epoch(share, [], start)
            for outcome in outcomes:
                if isinstance(outcome, Failure):
                    _note_traceback(outcome.exc, row)
                yield outcome
        except Exception as exc:  # the pipeline could not start (or broke)
            broken = exc
        finally:
            if pipeline is not None:
                pipeline.close()
        if pipeline is None and broken is not None:
            # A claiming worker whose pipeline never started fails what it claims (so do all
            # the others then); one whose pipeline broke leaves the rest to the other workers.
            for _ in share:
                yield Failure(broken)


def _note_traceback(exc: BaseException, row: int) -> None:
    """Note where an error from user code was raised (as torch does in its message): it
    reaches the main process without its traceback object."""
    if isinstance(exc, LoaderError) or exc.__traceback__ is None:
        return
    where = f"DataLoader worker process {row - 1}" if row else "the loader's main process"
    frames = "".join(traceback.format_tb(exc.__traceback__))
    exc.add_note(f"Original traceback in {where} (most recent call last):\n{frames.rstrip()}")
