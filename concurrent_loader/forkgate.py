"""Thread pools whose jobs a fork of their process waits for (the fork safety described in
:mod:`concurrent_loader.runtime`).
"""

from __future__ import annotations

import concurrent.futures
import os
import threading
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


class ForkGate:
    """Where a runtime's threads stop while their process forks.

    The loop thread parks in :meth:`park` (a loop callback); executor jobs pass through
    :meth:`job`. :meth:`hold` (before a fork) waits until the loop thread is parked (or has
    ended) and no job runs; :meth:`open` (after it, in the parent) lets both go on.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._forking = False
        self._parked = False
        self._loop_ended = False
        self._jobs = 0
        self._in_job = threading.local()

    def park(self) -> None:
        with self._cond:
            if not self._forking:
                return
            self._parked = True
            self._cond.notify_all()
            self._cond.wait_for(lambda: not self._forking)
            self._parked = False

    def loop_ended(self) -> None:
        with self._cond:
            self._loop_ended = True
            self._cond.notify_all()

    def job(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        with self._cond:
            self._cond.wait_for(lambda: not self._forking)
            self._jobs += 1
        self._in_job.active = True
        try:
            return fn(*args, **kwargs)
        finally:
            self._in_job.active = False
            with self._cond:
                self._jobs -= 1
                self._cond.notify_all()

    def hold(self, wake_loop: Callable[[], bool], timeout: float) -> bool:
        """Stop the loop and the executor; True once both are at rest (False on timeout)."""
        # A fork from inside a job waits for the other jobs only.
        own = 1 if getattr(self._in_job, "active", False) else 0
        with self._cond:
            self._forking = True
            if not (self._loop_ended or wake_loop()):
                self._loop_ended = True  # the loop is closed: only its thread's end is left
            return self._cond.wait_for(
                lambda: (self._parked or self._loop_ended) and self._jobs == own, timeout
            )

    def open(self) -> None:
        with self._cond:
            self._forking = False
            self._cond.notify_all()

    @property
    def forking(self) -> bool:
        return self._forking  # read without the lock: a hint, checked between jobs


class _Gated(concurrent.futures.ThreadPoolExecutor):
    _gate: ForkGate

    def submit(
        self, fn: Callable[..., T], /, *args: Any, **kwargs: Any
    ) -> concurrent.futures.Future[T]:
        return super().submit(self._gate.job, fn, *args, **kwargs)


class GatedExecutor(_Gated):
    """The loop's default executor (``run_in_executor``, ``asyncio.to_thread``): every job
    passes through the runtime's fork gate, and its threads are known, to be waited for."""

    def __init__(self, gate: ForkGate) -> None:
        self.threads: list[threading.Thread] = []
        super().__init__(
            thread_name_prefix="concurrent-loader-io-pool",
            initializer=lambda: self.threads.append(threading.current_thread()),
        )
        self._gate = gate


class GatedThreadPool(_Gated):
    """A thread pool whose jobs a fork of this process waits for (new ones wait to start):
    no thread of it is inside a C library when the process forks."""

    def __init__(self, max_workers: int, thread_name_prefix: str) -> None:
        super().__init__(max_workers=max_workers, thread_name_prefix=thread_name_prefix)
        self._gate = ForkGate()
        self._pid = os.getpid()
        pools.add(self)

    def forking(self) -> bool:
        """Whether this process is about to fork: a long job should end (and resubmit its
        rest) so that the fork need not wait for it."""
        return self._gate.forking

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        try:
            super().shutdown(wait, cancel_futures=cancel_futures)
        finally:
            # Jobs still running now (stuck in user code after a stall) are not waited for.
            pools.discard(self)


#: Thread pools whose jobs a fork of this process waits for.
pools: weakref.WeakSet[GatedThreadPool] = weakref.WeakSet()
