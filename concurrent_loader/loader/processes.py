"""The worker processes of an inner DataLoader, as the main process sees them.

The inner DataLoader's ``multiprocessing_context`` is :meth:`WorkerProcesses.context`, the
user's (or torch's default) context noting each process it makes, so a worker the OS killed
is named with its pid and signal even after torch reaped it. Only weak references are kept.
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
from .worker import PlannedBatches

__all__ = ["Death", "WorkerProcesses", "Workers", "drop_tracebacks", "worker_error"]


class Death(NamedTuple):
    """A worker process that ended with an error: ``exitcode`` is its exit status, or minus
    the signal that killed it (as ``multiprocessing`` reports it)."""

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


class WorkerProcesses:
    """The processes started through :meth:`context`, worker ``w`` the ``w``-th."""

    def __init__(self) -> None:
        self._started: list[weakref.ref[BaseProcess]] = []

    def context(self, base: BaseContext) -> BaseContext:
        """``base``, noting here each process it makes."""
        return _Noting(base, self._started)

    def dead(self) -> list[Death]:
        """The processes that have ended with an error (reaped, if torch has not yet)."""
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
    """The error a loader raises for worker processes that died without raising."""
    killed = any(death.exitcode == -signal.SIGKILL for death in deaths)
    hint = " (the OS kills a process with SIGKILL when it runs out of memory)" if killed else ""
    return WorkerError(
        f"loader worker process died without raising: {', '.join(map(str, deaths))}{hint}",
        stage="worker",
        cause=Reason.WORKER_DIED,
    )


class _Noting(BaseContext):
    """A multiprocessing context that is ``base`` for all torch asks of it (processes,
    queues, events, the start method), and notes the processes it makes."""

    def __init__(self, base: BaseContext, started: list[weakref.ref[BaseProcess]]) -> None:
        self._base: Any = base  # every concrete context has ``Process``; typeshed's base has none
        self._started = started

    def Process(self, *args: Any, **kwargs: Any) -> BaseProcess:
        process: BaseProcess = self._base.Process(*args, **kwargs)
        self._started.append(weakref.ref(process))
        return process

    def Queue(self, maxsize: int = 0) -> Any:
        return self._base.Queue(maxsize)

    def Event(self) -> Any:
        return self._base.Event()

    def get_context(self, method: Any = None) -> Any:
        return self._base.get_context(method)

    def get_start_method(self, allow_none: Any = False) -> Any:
        return self._base.get_start_method(allow_none)


def drop_tracebacks(exc: BaseException | None) -> None:
    """The tracebacks of an error and of its causes hold the frames they passed through (the
    pipeline, torch's iterator and so the worker processes) alive for as long as the caller
    keeps the error."""
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
    """The inner DataLoader over each epoch's plan (a new one each epoch, or the one persistent
    workers keep, with its shared plans rewritten), its workers producing ``dataset``'s
    batches with ``options``, seeded from ``generator``."""

    def __init__(
        self,
        dataset: Dataset[Any],
        options: PipelineOptions,
        stats: SharedStats,
        generator: torch.Generator,
    ) -> None:
        self._dataset, self._options, self._stats = dataset, options, stats
        self.generator = generator
        self.processes = WorkerProcesses()  # the latest inner loader's
        self._persistent: tuple[DataLoader[Any], PlannedBatches] | None = None
        self.started = False  # the persistent inner loader's workers have started

    def inner(
        self,
        outer: DataLoader[Any],
        batches: list[list[Any]],
        skip: int,
        collate: Callable[[list[Any]], Any],
        predicted: list[list[Any]],
    ) -> DataLoader[Any]:
        """The plain DataLoader that yields this epoch's batches from ``skip`` on, with the
        ``outer`` loader's torch settings."""
        if self._persistent is not None:
            inner, planned = self._persistent
            planned._cl_plan.write(batches[skip:], may_grow=False, lock=planned._cl_claims)
            if planned._cl_next is not None:
                try:
                    planned._cl_next.write(predicted, may_grow=False)
                except ConfigError:  # larger than the first epoch: not fetched ahead
                    planned._cl_next.write([], may_grow=False)
            return inner
        self.processes = WorkerProcesses()
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
        planned = PlannedBatches(
            self._dataset, plan, collate, self._options, self._stats, claims, next_plan
        )
        context = outer.multiprocessing_context or torch.multiprocessing.get_context()
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="This DataLoader will create")
            inner = DataLoader(
                planned,
                batch_size=None,
                num_workers=workers,
                collate_fn=_passthrough,
                pin_memory=outer.pin_memory,
                timeout=outer.timeout,
                worker_init_fn=outer.worker_init_fn,
                multiprocessing_context=self.processes.context(context) if workers else None,
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
        naming each that died without raising (torch's ``RuntimeError``, from its iterator or
        SIGCHLD handler), else ``exc``. Their inner iterator is let go, persistent or not: the
        next epoch starts new workers, as torch's does."""
        deaths = processes.dead() if isinstance(exc, RuntimeError) else []
        if not deaths:
            return exc
        # The frames in the tracebacks of the error and of its causes hold torch's iterator.
        drop_tracebacks(exc)
        self.let_go(processes)
        failure = worker_error(deaths)
        failure.__cause__ = exc
        return failure

    def died_between_epochs(self) -> WorkerError | None:
        """A ``WorkerError`` if a persistent worker died since the last epoch (torch's SIGCHLD
        handler may have said so already, in whatever the main process ran); the next epoch
        then starts new workers."""
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
