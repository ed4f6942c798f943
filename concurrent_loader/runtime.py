"""The per-process runtime: one asyncio event loop (uvloop when installed) on a background thread.

Each process makes its own on first use. It is reference counted (:func:`acquire_runtime`,
:meth:`Runtime.release`): the last lease closes the clients cached on it, closes the loop
once its last connection is gone (:mod:`concurrent_loader.loops`) and joins its threads.

Fork safety: a forked child inherits C-library locks as they were (OpenSSL 3 takes global
locks in ``SSLContext``, random bytes and thread exit), so no runtime thread is inside a C
library at a fork: after the last lease its threads have ended at the OS level; while it is
live, a fork parks the loop thread between two turns and waits for the running jobs of its
executor and of every :class:`~concurrent_loader.forkgate.GatedThreadPool`. Not covered:
threads it runs no jobs on (uvloop's ``getaddrinfo`` pool). A fork that waits past
``QUIESCE_TIMEOUT_S`` goes on with a warning.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import logging
import os
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine, Hashable, Iterable
from typing import Any, Protocol, TypeVar

from .finish import later
from .forkgate import ForkGate, GatedExecutor, GatedThreadPool, pools
from .loops import loop_class

__all__ = ["AsyncCloseable", "GatedThreadPool", "Runtime", "acquire_runtime"]

log = logging.getLogger(__name__)

#: seconds a closing runtime waits for its loop to cancel tasks and close clients
CLOSE_TIMEOUT_S = 10.0
#: seconds a fork waits for threads to reach a safe point (a close, to end), then warns
QUIESCE_TIMEOUT_S = 5.0
#: seconds a runtime closing at interpreter exit waits for its (daemon) threads
EXIT_JOIN_TIMEOUT_S = 0.5
#: seconds a closing runtime waits for connections still closing before it aborts them
CONNECTIONS_CLOSE_TIMEOUT_S = 2.0
T = TypeVar("T")


class AsyncCloseable(Protocol):
    async def close(self) -> None: ...


class Runtime:
    """An event loop running on a daemon thread, plus the loop-bound objects made on it."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.loop = loop_class()()
        self._leases = 0
        self._closed = False
        self._resources: dict[Hashable, AsyncCloseable] = {}
        self._gate = ForkGate()
        self._executor = GatedExecutor(self._gate)
        self.loop.set_default_executor(self._executor)
        started = threading.Event()
        self._thread = threading.Thread(
            target=self._run, args=(started,), name="concurrent-loader-io", daemon=True
        )
        self._thread.start()
        started.wait()
        _live.add(self)

    def _run(self, started: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.call_soon(started.set)
        try:
            self.loop.run_forever()
        finally:
            try:
                self.loop.run_until_complete(self.loop.shutdown_asyncgens())
                self.loop.close()
            finally:
                self._gate.loop_ended()

    # ------------------------------------------------------------------ fork safety

    def _quiesce_for_fork(self) -> None:
        """Before a fork: park the loop thread and the executor (see the module docstring)."""
        if threading.current_thread() is self._thread:
            return  # a fork from a loop callback: the loop is between two calls already

        def wake_loop() -> bool:
            try:
                self.loop.call_soon_threadsafe(self._gate.park)
            except RuntimeError:  # closed: its thread is on its way out
                return False
            return True

        deadline = time.monotonic() + QUIESCE_TIMEOUT_S
        at_rest = self._gate.hold(wake_loop, QUIESCE_TIMEOUT_S)
        if at_rest:  # threads ended in Python may still be in their destructors
            at_rest = _wait_until_ended([self._thread, *self._executor.threads], deadline)
        if not at_rest:
            log.warning(
                "the concurrent-loader event loop or one of its executor threads did not "
                "reach a safe point within %.0f s; forking anyway (a child may hang in a C "
                "library lock)",
                QUIESCE_TIMEOUT_S,
            )

    def _resume_after_fork(self) -> None:
        self._gate.open()

    @property
    def closed(self) -> bool:
        return self._closed

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Schedule ``coro`` on the loop from any other thread."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the loop and wait for its result (never call from the loop)."""
        return self.submit(coro).result()

    def call_soon(self, callback: Callable[..., object], *args: object) -> None:
        self.loop.call_soon_threadsafe(callback, *args)

    async def resource(
        self, key: Hashable, factory: Callable[[], Awaitable[AsyncCloseable]]
    ) -> Any:
        """The loop-bound object cached under ``key``, made by ``factory`` on first use."""
        found = self._resources.get(key)
        if found is None:
            found = await factory()
            if key in self._resources:
                await found.close()
                found = self._resources[key]
            else:
                self._resources[key] = found
        return found

    def _lease(self) -> None:
        self._leases += 1

    def release(self) -> None:
        """Return one lease; the last one closes the runtime. On one of the runtime's own
        threads it is returned from another (:mod:`concurrent_loader.finish`): a close joins
        those threads, and one closing at exit holds the lock while it waits for them."""
        if self.pid == os.getpid() and threading.current_thread() in self._own_threads():
            later(self.release)
            return
        with _lock:  # reentrant: a collection on a thread holding it may return a lease
            self._leases -= 1
            if self._leases > 0 or self._closed:
                return
            self._close_locked()

    def _own_threads(self) -> list[threading.Thread]:
        return [self._thread, *self._executor.threads]

    def _close_locked(self, *, at_exit: bool = False) -> None:
        global _current
        self._closed = True
        if _current is self:
            _current = None
        if self.pid != os.getpid():
            return  # a forked copy: the thread does not exist here, nothing to join
        if threading.current_thread() is self._thread:
            raise RuntimeError("the runtime cannot be closed from its own loop")
        connections_timeout = EXIT_JOIN_TIMEOUT_S if at_exit else CONNECTIONS_CLOSE_TIMEOUT_S
        try:
            self.submit(self._close_resources(connections_timeout)).result(timeout=CLOSE_TIMEOUT_S)
        except concurrent.futures.TimeoutError:  # stuck in a C call, say: leave it behind
            log.warning(
                "the concurrent-loader event loop did not close within %.0f s; leaving it",
                CLOSE_TIMEOUT_S,
            )
            _live.discard(self)  # a stuck thread cannot be quiesced: forks stop trying
            return
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
        deadline = time.monotonic() + (EXIT_JOIN_TIMEOUT_S if at_exit else QUIESCE_TIMEOUT_S)
        self._thread.join(max(0.0, deadline - time.monotonic()))
        self._executor.shutdown(wait=False, cancel_futures=True)
        threads = self._own_threads()
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        if at_exit:  # no fork follows: no OS-level wait to delay the exit
            _live.discard(self)
            return
        # Joined threads may still be in OpenSSL's per-thread cleanup, holding its locks.
        if any(thread.is_alive() for thread in threads) or not _wait_until_ended(threads, deadline):
            log.warning(
                "the concurrent-loader threads did not end within %.0f s of their loop",
                QUIESCE_TIMEOUT_S,
            )
        _live.discard(self)

    async def _close_resources(self, connections_timeout: float) -> None:
        # Tasks still running (users that did not close): cancelled, none left pending.
        current = asyncio.current_task()
        tasks = [task for task in asyncio.all_tasks() if task is not current]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        resources, self._resources = list(self._resources.values()), {}
        for resource in resources:
            try:
                await resource.close()
            except Exception:  # closing must go on for the others
                log.exception("error while closing %r", resource)
        await self.loop.connections.close(connections_timeout)


def _wait_until_ended(threads: Iterable[threading.Thread], deadline: float) -> bool:
    """Wait until the OS threads of ``threads`` (ended in Python) are gone, looking at
    ``/proc/self/task`` at growing intervals (no ``/proc``: at once); False if one is still
    there at ``deadline`` (``time.monotonic()``)."""
    if not os.path.isdir("/proc/self/task"):
        return True
    delay = 0.0002
    for thread in threads:
        tid = thread.native_id
        if tid is None or thread.is_alive():
            continue
        path = f"/proc/self/task/{tid}"
        while os.path.exists(path):
            if time.monotonic() >= deadline:
                return False
            time.sleep(delay)
            delay = min(delay * 2, 0.01)
    return True


_lock = threading.RLock()
_current: Runtime | None = None
# Runtimes of this process whose threads may still run: the ones a fork must quiesce.
_live: set[Runtime] = set()
# Runtimes inherited through fork, kept unreachable: never touched or finalised here.
_orphans: list[Runtime] = []
# What a fork in progress holds, opened after it (even if closed meanwhile).
_held_runtimes: list[Runtime] = []
_held_pools: list[GatedThreadPool] = []


def acquire_runtime() -> Runtime:
    """This process's runtime, started if needed, with one more lease on it."""
    global _current
    with _lock:
        while True:
            runtime = _current
            if runtime is None or runtime.pid != os.getpid():
                if runtime is not None:
                    _orphans.append(runtime)
                runtime = _current = Runtime()
            runtime._lease()
            if not runtime.closed:  # a collection just now may have returned its last lease
                return runtime


def _before_fork() -> None:
    # Not under _lock: the forking thread may hold it. What is held here is opened after the
    # fork even if it closed meanwhile (its queued jobs would otherwise wait for ever).
    pid = os.getpid()
    _held_runtimes[:] = [runtime for runtime in list(_live) if runtime.pid == pid]
    _held_pools[:] = [pool for pool in list(pools) if pool._pid == pid]
    for runtime in _held_runtimes:
        runtime._quiesce_for_fork()
    deadline = time.monotonic() + QUIESCE_TIMEOUT_S
    for pool in _held_pools:
        if not pool._gate.hold(lambda: False, max(0.0, deadline - time.monotonic())):
            log.warning(
                "a concurrent-loader decode or __getitem__ thread did not finish its job "
                "within %.0f s; forking anyway (a child may hang in a C library lock)",
                QUIESCE_TIMEOUT_S,
            )


def _after_fork_in_parent() -> None:
    for runtime in _held_runtimes:
        runtime._resume_after_fork()
    for pool in _held_pools:
        pool._gate.open()
    _held_runtimes.clear()
    _held_pools.clear()


def _after_fork_in_child() -> None:
    global _current, _lock
    # The parent's pools have no thread here; their copies are only ever closed.
    for pool in [*pools, *_held_pools]:
        pool._gate.open()
    pools.clear()
    _held_runtimes.clear()
    _held_pools.clear()
    _lock = threading.RLock()
    if _current is not None:
        _orphans.append(_current)
        _current = None
    _orphans.extend(_live)
    _live.clear()


def _close_at_exit() -> None:
    with _lock:
        runtime = _current
        if runtime is not None and not runtime.closed and runtime.pid == os.getpid():
            runtime._close_locked(at_exit=True)


os.register_at_fork(
    before=_before_fork, after_in_parent=_after_fork_in_parent, after_in_child=_after_fork_in_child
)
atexit.register(_close_at_exit)
