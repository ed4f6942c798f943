"""Work that finalizers leave: :func:`later` queues it, a thread of its own runs it.

A finalizer (``weakref.finalize``, ``multiprocessing.util.Finalize``) runs on whatever thread
collects the object, holding whatever that thread holds: the runtime's own loop, the
runtime's lock, the cache's ledger lock through another store on the same directory, a
thread pool's lock inside ``submit``. Closing a runtime or finishing a cache's writes takes
those very locks and waits for those very threads, so a finalizer only queues the work.
:func:`later` takes no lock and never waits (``SimpleQueue.put`` is reentrant); a low-level
thread (``_thread``: starting it takes none of ``threading``'s locks) runs the queue, and
at a process's exit (multiprocessing's exit hook, which a worker runs too) what is queued
or running is finished on the exiting thread.
"""

from __future__ import annotations

import _thread
import logging
import multiprocessing.util
import os
import queue
import threading
from collections.abc import Callable

__all__ = ["THREAD_NAME", "later", "wait"]

log = logging.getLogger(__name__)

#: after the cache's finalizers (priority 10), which queue their work here at exit
EXIT_PRIORITY = 5

_jobs: queue.SimpleQueue[Callable[[], object]] = queue.SimpleQueue()
_running = threading.Lock()  # held while jobs run; never taken by later()
_draining = False  # a drainer thread may be running (read and written under the GIL)


#: the name of the thread that runs the queue
THREAD_NAME = "concurrent-loader-finish"


def later(job: Callable[[], object]) -> None:
    """Run ``job`` soon on another thread, or at this process's exit. Safe in a finalizer."""
    global _draining
    _jobs.put(job)
    if not _draining:
        _draining = True
        try:
            _thread.start_new_thread(_start_drainer, ())
        except RuntimeError:  # no new threads at interpreter shutdown: the exit runs it
            _draining = False


def wait() -> None:
    """Run every queued job here, after any a drainer is running."""
    with _running:
        _run_queued()


def _start_drainer() -> None:
    # On a low-level thread, which holds no lock: a named thread of threading's does the
    # work (jobs that ask threading for their thread would leave a dummy entry for this one).
    global _draining
    try:
        threading.Thread(target=_drain, name=THREAD_NAME, daemon=True).start()
    except BaseException:  # no thread: the next later(), or the exit, runs the queue
        _draining = False


def _drain() -> None:
    global _draining
    try:
        while True:
            wait()
            _draining = False
            # A job queued after the queue looked empty, by a later() that saw us running.
            if _jobs.empty():
                return
            _draining = True
    finally:
        _draining = False


def _run_queued() -> None:
    while True:
        try:
            job = _jobs.get_nowait()
        except queue.Empty:
            return
        try:
            job()
        except BaseException:  # the others still run
            log.exception("finishing %r failed", job)


def _register_exit(_: object = None) -> None:
    multiprocessing.util.Finalize(None, wait, exitpriority=EXIT_PRIORITY)


def _after_fork_in_child() -> None:
    global _running, _draining, _jobs
    # The parent's drainer does not run here; its jobs are the parent's.
    _running, _draining, _jobs = threading.Lock(), False, queue.SimpleQueue()
    _register_exit()


class _Hook:
    """A multiprocessing child clears the exit hooks it inherited (or registered while
    unpickling) before it runs; its after-fork hooks, run then, register this one again."""


_hook = _Hook()
_register_exit()
os.register_at_fork(after_in_child=_after_fork_in_child)
multiprocessing.util.register_after_fork(_hook, _register_exit)
