"""The per-process runtime: one asyncio event loop on a background thread.

Each process (the main process when ``num_workers=0``, otherwise every DataLoader worker)
gets its own runtime, created on first use inside that process, so nothing made before a
``fork``, ``spawn`` or ``forkserver`` start is ever used after it. The loop runs uvloop when
it is installed.

The runtime is reference counted: users take a lease (:func:`acquire_runtime`) and give it
back (:meth:`Runtime.release`); when the last lease is returned the loop's resources
(readers, sockets) are closed and the thread joined, so a finished or abandoned iteration
leaves no thread, loop or socket behind. Objects that belong to the loop (readers) are
cached on the runtime and closed with it.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import logging
import os
import threading
from collections.abc import Awaitable, Callable, Coroutine, Hashable
from typing import Any, Protocol, TypeVar

__all__ = ["AsyncCloseable", "Runtime", "acquire_runtime"]

log = logging.getLogger(__name__)

#: seconds a closing runtime waits for its loop to cancel tasks and close clients
CLOSE_TIMEOUT_S = 10.0
T = TypeVar("T")


class AsyncCloseable(Protocol):
    async def close(self) -> None: ...


def _new_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


class Runtime:
    """An event loop running on a daemon thread, plus the loop-bound objects made on it."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.loop = _new_loop()
        self._leases = 0
        self._closed = False
        self._resources: dict[Hashable, AsyncCloseable] = {}
        started = threading.Event()
        self._thread = threading.Thread(
            target=self._run, args=(started,), name="concurrent-loader-io", daemon=True
        )
        self._thread.start()
        started.wait()

    def _run(self, started: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.call_soon(started.set)
        try:
            self.loop.run_forever()
        finally:
            self.loop.run_until_complete(self.loop.shutdown_asyncgens())
            self.loop.close()

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
        """The loop-bound object cached under ``key``, made by ``factory`` on first use.

        Runs on the loop; concurrent callers of one key get the same object.
        """
        found = self._resources.get(key)
        if found is None:
            found = await factory()
            # Another caller may have made one while we awaited: keep the first.
            if key in self._resources:
                await found.close()
                found = self._resources[key]
            else:
                self._resources[key] = found
        return found

    def _lease(self) -> None:
        self._leases += 1

    def release(self) -> None:
        """Return one lease; the last one closes the runtime."""
        with _lock:
            self._leases -= 1
            if self._leases > 0 or self._closed:
                return
            self._close_locked()

    def _close_locked(self) -> None:
        global _current
        self._closed = True
        if _current is self:
            _current = None
        if self.pid != os.getpid():
            return  # a forked copy: the thread does not exist here, nothing to join
        if threading.current_thread() is self._thread:
            raise RuntimeError("the runtime cannot be closed from its own loop")
        try:
            self.submit(self._close_resources()).result(timeout=CLOSE_TIMEOUT_S)
        except concurrent.futures.TimeoutError:
            # The loop thread is stuck (in a C call, say): leave the daemon thread behind
            # rather than hang the process that is closing it.
            log.warning(
                "the concurrent-loader event loop did not close within %.0f s; leaving it",
                CLOSE_TIMEOUT_S,
            )
            return
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join()

    async def _close_resources(self) -> None:
        # Tasks still running belong to users that did not close (e.g. at interpreter exit):
        # cancel them first so none is destroyed pending or left holding a connection.
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
        # Give transports closed above one turn of the loop to release their sockets.
        await asyncio.sleep(0)


_lock = threading.Lock()
_current: Runtime | None = None
# Runtimes inherited through fork: their thread does not exist in the child and their
# objects must not be touched or finalised there, so the child keeps them unreachable.
_orphans: list[Runtime] = []


def acquire_runtime() -> Runtime:
    """This process's runtime, started if needed, with one more lease on it."""
    global _current
    with _lock:
        runtime = _current
        if runtime is None or runtime.pid != os.getpid():
            if runtime is not None:
                _orphans.append(runtime)
            runtime = _current = Runtime()
        runtime._lease()
        return runtime


def _after_fork_in_child() -> None:
    global _current, _lock
    _lock = threading.Lock()
    if _current is not None:
        _orphans.append(_current)
        _current = None


def _close_at_exit() -> None:
    with _lock:
        runtime = _current
        if runtime is not None and not runtime.closed and runtime.pid == os.getpid():
            runtime._close_locked()


os.register_at_fork(after_in_child=_after_fork_in_child)
atexit.register(_close_at_exit)
