"""The worker processes of an inner DataLoader, as the main process sees them: which died,
and how.

torch starts its workers through the ``multiprocessing_context`` it is given. The inner
DataLoader is given :meth:`WorkerProcesses.context`: the user's context (torch's default
one when they gave none), which also notes each process it makes. So the loader knows its
workers from their start, before any of them runs a line of ours, and a worker that the OS
killed is named with its pid and signal even once torch has reaped it.

Only weak references are kept: the processes live exactly as long as torch's iterator keeps
them, and end by its shutdown.
"""

from __future__ import annotations

import signal
import weakref
from multiprocessing.context import BaseContext
from multiprocessing.process import BaseProcess
from typing import Any, NamedTuple

from ..errors import Reason, WorkerError

__all__ = ["Death", "WorkerProcesses", "worker_error"]


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
