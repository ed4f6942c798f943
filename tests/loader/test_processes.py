"""WorkerProcesses: the processes a multiprocessing context started, and which of them died
how (a signal, an exit code), reaped as they are found."""

from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import sys
import weakref

import psutil
from _forking import fork_warning

from concurrent_loader import Reason, WorkerError
from concurrent_loader.loader.processes import Death, WorkerProcesses, worker_error


def _killed() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def _exits_with_3() -> None:
    sys.exit(3)


def _ends() -> None:
    pass


@fork_warning
def test_the_dead_are_named_with_their_signal_or_code_and_reaped():
    workers = context = WorkerProcesses(multiprocessing.get_context("fork"))
    processes = [context.Process(target=target) for target in (_killed, _exits_with_3, _ends)]
    for process in processes:
        process.start()
    for process in processes:  # ended, not reaped by the test
        try:
            os.waitid(os.P_PID, process.pid, os.WEXITED | os.WNOWAIT)
        except ChildProcessError:  # a later start() reaped it (multiprocessing's cleanup)
            assert process.exitcode is not None
    assert workers.dead() == [
        Death(0, processes[0].pid, -signal.SIGKILL),
        Death(1, processes[1].pid, 3),
    ]
    assert not any(psutil.pid_exists(process.pid) for process in processes[:2])
    error = worker_error(workers.dead())
    assert isinstance(error, WorkerError)
    assert error.cause is Reason.WORKER_DIED
    assert f"worker 0 (pid {processes[0].pid}) killed by SIGKILL" in str(error)
    assert f"worker 1 (pid {processes[1].pid}) exited with code 3" in str(error)
    assert "out of memory" in str(error)
    processes[2].join()


def test_a_process_is_not_kept_alive_by_its_note():
    workers = context = WorkerProcesses(multiprocessing.get_context("spawn"))
    process = weakref.ref(context.Process(target=_ends))
    assert process() is None
    assert workers.dead() == []


def test_making_a_loader_leaves_the_start_method_unset():
    # As with a stock DataLoader, a script may make its loader and then choose the start method.
    script = (
        "import multiprocessing, torch\n"
        "from concurrent_loader import ConcurrentDataLoader\n"
        "loader = ConcurrentDataLoader(list(range(4)), batch_size=2, num_workers=1)\n"
        "multiprocessing.set_start_method('spawn')\n"
        "print(multiprocessing.get_start_method())\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "spawn"
