"""The worker processes of an inner DataLoader, as the main process sees them.

The inner DataLoader's ``multiprocessing_context`` (:class:`WorkerProcesses`) notes each
process it makes, so a worker the OS killed is named with its pid and signal even after torch
reaped it.
:class:`Workers` holds each epoch's inner DataLoader and turns torch's ``RuntimeError`` into
a ``WorkerError`` naming the workers that died.
"""

from __future__ import annotations

import signal
import warnings
import weakref
from collections.abc import Callable
from multiprocessing.context import BaseContext
from multiprocessing.process import BaseProcess
from typing import Any, NamedTuple

import torch.multiprocessing
from torch.utils.data import DataLoader, Dataset

from ..errors import ConfigError, Reason, WorkerError
from ..metrics import SharedStats
from ..pipeline import PipelineOptions
from .plan import EpochPlan, Lock
from .worker import Planned, PlannedBatches

__all__ = ["Death", "WorkerProcesses", "Workers", "drop_tracebacks", "worker_error"]


class Death(NamedTuple):
    """A worker process that ended with an error (``exitcode``: minus the signal if killed)."""

    worker: int
    pid: int
    exitcode: int

    def __str__(self) -> str:
        if self.exitcode < 0:
            try:
                how = f"killed by {signal.Signals(-self.exitcode).name}"
            except ValueError:
                how = f"killed by signal {-self.exitcode}"
        else:
            how = f"exited with code {self.exitcode}"
        return f"worker {self.worker} (pid {self.pid}) {how}"


class WorkerProcesses(BaseContext):
    """A multiprocessing context that is ``base`` (default: torch's) for what torch's workers
    ask of it (``Process``, ``Queue``, ``Event``), noting the processes it makes (weakly):
    worker ``w`` is the ``w``-th."""

    def __init__(self, base: BaseContext | None = None) -> None:
        self._given = base
        self._started: list[weakref.ref[BaseProcess]] = []

    @property
    def _base(self) -> Any:
        # Looked up when a worker starts, not when the loader is made: ``get_context()`` fixes
        # the default start method, and a user may still set it after making the loader.
        # (Every concrete context has ``Process``; typeshed's base has none, hence ``Any``.)
        return self._given or torch.multiprocessing.get_context()

    def Process(self, *args: Any, **kwargs: Any) -> BaseProcess:
        process: BaseProcess = self._base.Process(*args, **kwargs)
        self._started.append(weakref.ref(process))
        return process

    def Queue(self, maxsize: int = 0) -> Any:
        return self._base.Queue(maxsize)

    def Event(self) -> Any:
        return self._base.Event()

    def dead(self) -> list[Death]:
        deaths = []
        for worker, ref in enumerate(self._started):
            process = ref()
            # ``exitcode`` asks the kernel without waiting, and reaps an ended process. An exit
            # with status 0 is a worker that finished its share (or was shut down).
            code = process.exitcode if process is not None else None
            if process is not None and process.pid is not None and code:
                deaths.append(Death(worker, process.pid, code))
        return deaths


def worker_error(deaths: list[Death]) -> WorkerError:
    killed = any(death.exitcode == -signal.SIGKILL for death in deaths)
    hint = " (the OS kills a process with SIGKILL when it runs out of memory)" if killed else ""
    return WorkerError(
        f"loader worker process died without raising: {', '.join(map(str, deaths))}{hint}",
        stage="worker",
        cause=Reason.WORKER_DIED,
    )


def drop_tracebacks(exc: BaseException | None) -> None:
    """Drop the tracebacks of an error and its causes: their frames (torch's iterator, so the
    worker processes) would live as long as the caller keeps the error."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        exc.__traceback__ = None
        if exc.__context__ is not None and exc.__context__ is not exc.__cause__:
            drop_tracebacks(exc.__context__)
        exc = exc.__cause__


def _passthrough(batch: Any) -> Any:
    return batch


class Workers:
    """The inner DataLoader over each epoch's plan: a new one each epoch, or the one persistent
    workers keep, with its shared plans rewritten."""

    def __init__(
        self,
        dataset: Dataset[Any],
        options: PipelineOptions,
        stats: SharedStats,
        generator: torch.Generator,
    ) -> None:
        self._dataset, self._stats = dataset, stats
        #: what the next new worker processes are given
        self.options = options
        self.generator = generator
        self.processes = WorkerProcesses()  # the latest inner loader's
        self._persistent: tuple[DataLoader[Any], Planned] | None = None
        self.started = False  # the persistent inner loader's workers have started

    def inner(
        self,
        outer: DataLoader[Any],
        batches: list[list[Any]],
        skip: int,
        collate: Callable[[list[Any]], Any],
        predicted: list[list[Any]],
    ) -> DataLoader[Any]:
        if self._persistent is not None:
            inner, planned = self._persistent
            planned.plan.write(batches[skip:], may_grow=False, lock=planned.claims)
            if planned.next_plan is not None:
                try:
                    planned.next_plan.write(predicted, may_grow=False)
                except ConfigError:  # larger than the first epoch: not fetched ahead
                    planned.next_plan.write([], may_grow=False)
            return inner
        self.processes = WorkerProcesses(outer.multiprocessing_context)
        workers = outer.num_workers
        claims: Lock | None = None
        if workers > 0 and not outer.in_order:
            claims = (outer.multiprocessing_context or torch.multiprocessing).Lock()
        plan = EpochPlan()
        plan.write(batches[skip:], may_grow=True, room=batches if skip else ())
        next_plan: EpochPlan | None = None
        if outer.persistent_workers and claims is None:
            next_plan = EpochPlan()
            next_plan.write(predicted, may_grow=True, room=batches)
        planned = Planned(
            self._dataset, plan, collate, self.options, self._stats, claims, next_plan
        )
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="This DataLoader will create")
            inner = DataLoader(
                PlannedBatches(planned),
                batch_size=None,
                num_workers=workers,
                collate_fn=_passthrough,
                pin_memory=outer.pin_memory,
                timeout=outer.timeout,
                worker_init_fn=outer.worker_init_fn,
                multiprocessing_context=self.processes if workers else None,
                generator=self.generator,
                prefetch_factor=outer.prefetch_factor,
                persistent_workers=outer.persistent_workers,
                pin_memory_device=outer.pin_memory_device,
                in_order=outer.in_order,
            )
        if outer.persistent_workers:
            self._persistent = (inner, planned)
        return inner

    def failure(self, exc: BaseException, processes: WorkerProcesses) -> BaseException:
        """The error to raise for ``exc``, raised while ``processes`` ran: a ``WorkerError``
        naming each that died without raising (torch's ``RuntimeError``), else ``exc``; the
        next epoch then starts new workers, as torch's does."""
        deaths = processes.dead() if isinstance(exc, RuntimeError) else []
        if not deaths:
            return exc
        drop_tracebacks(exc)
        self.let_go(processes)
        failure = worker_error(deaths)
        failure.__cause__ = exc
        return failure

    def died_between_epochs(self) -> WorkerError | None:
        """A ``WorkerError`` if a persistent worker died since the last epoch (torch's SIGCHLD
        handler may have said so already); the next epoch then starts new workers."""
        if self._persistent is None or not (deaths := self.processes.dead()):
            return None
        self.let_go(self.processes)
        return worker_error(deaths)

    def let_go(self, processes: WorkerProcesses) -> None:
        """Drop the persistent inner loader, if ``processes`` are its: its iterator, and so
        its workers, end once nothing else refers to them; the next epoch starts new ones."""
        if self._persistent is not None and processes is self.processes:
            self._persistent = None
            self.started = False
