"""Writing entries behind reads: one thread per store, bounded, paused after a failure, and
what a store leaves to finish when it goes (:class:`Leftovers`).

The object's fill lock is released once its entry is in place or given up. An entry is at
most ``MAX_ENTRY_BYTES``; at most ``MAX_PENDING_BYTES`` wait for the writer, room for a batch
of large entries arriving at once (256 pre-sized raw images of 262 KB are 67 MB); beyond
either, an object is not cached. A fill never waits for the disk. A failed write pauses
writing for ``RETRY_FIRST_S``, doubling per failure in a row up to ``RETRY_MAX_S``; a retry
first reopens a directory removed or made again.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import threading
import time
from collections.abc import Callable

from ..runtime import Runtime, acquire_runtime
from ..stores.base import Body
from .directory import CacheDirectory
from .layout import CACHE_ERRORS, data_checksum, footer

__all__ = [
    "MAX_ENTRY_BYTES",
    "MAX_PENDING_BYTES",
    "RETRY_FIRST_S",
    "RETRY_MAX_S",
    "EntryWriter",
    "Leftovers",
]

log = logging.getLogger(__name__)

#: bytes of fetched objects waiting for the writer, at most, per store
MAX_PENDING_BYTES = 256 * 1024 * 1024
#: the largest entry written (a larger object is read in parts, which the cache does not keep)
MAX_ENTRY_BYTES = 32 * 1024 * 1024
RETRY_FIRST_S = 1.0
RETRY_MAX_S = 60.0


class EntryWriter:
    """Writes entries on ``executor`` (one thread); ``on_failure`` hears of each failure."""

    def __init__(
        self,
        executor: concurrent.futures.ThreadPoolExecutor,
        on_failure: Callable[[Exception], None],
    ) -> None:
        self._executor = executor
        self._on_failure = on_failure
        self._lock = threading.Lock()
        self._pending = 0
        #: the current pause (0: the last write succeeded) and when writes resume
        self._pause_s = 0.0
        self._resume_at = 0.0

    def writing(self) -> bool:
        return time.monotonic() >= self._resume_at

    def failed(self, exc: Exception) -> None:
        with self._lock:
            self._pause_s = min(max(RETRY_FIRST_S, 2 * self._pause_s), RETRY_MAX_S)
            self._resume_at = time.monotonic() + self._pause_s
        self._on_failure(exc)

    def submit(
        self,
        directory: CacheDirectory,
        name: str,
        source: str,
        body: Body,
        release: Callable[[], None],
        *,
        replace: bool,
    ) -> None:
        """Write ``body`` as the entry ``name``; ``release`` once it is in place or given up."""
        data = body.data
        size = len(data)
        try:
            skip = not self.writing() or (not replace and directory.looks_full(size))
        except CACHE_ERRORS as exc:
            self.failed(exc)
            skip = True
        with self._lock:
            skip = skip or size > MAX_ENTRY_BYTES or self._pending + size > MAX_PENDING_BYTES
            if not skip:
                self._pending += size
        if skip:
            release()
            return
        try:
            # Before the caller holds the buffer: a later change to it fails the entry's check.
            tail = footer(size, data_checksum(data), body.etag, source)
            self._executor.submit(self._write, directory, name, data, tail, release, replace)
        except (ValueError, RuntimeError):  # an ETag or name too long to store; or closing
            with self._lock:
                self._pending -= size
            release()

    def _write(
        self,
        directory: CacheDirectory,
        name: str,
        data: bytes | bytearray,
        tail: bytes,
        release: Callable[[], None],
        replace: bool,
    ) -> None:
        try:
            if self.writing():
                if self._pause_s:  # the first write after a failure
                    directory.refresh()
                directory.put(name, data, tail, replace=replace)
                if self._pause_s:
                    log.info("writes to the cache at %s resumed", directory.root)
                    with self._lock:
                        self._pause_s = 0.0
        except CACHE_ERRORS as exc:  # a link in the cache's place is refused too
            self.failed(exc)
        finally:
            release()
            with self._lock:
                self._pending -= len(data)


class Leftovers:
    """What a cached store leaves to finish (its writer, reads for the ledger, the
    directory's files, a runtime lease): done once, at ``close()``, or after collection or
    at process exit, so it holds no reference to the store (one on the local path is never
    closed)."""

    def __init__(self, directory: CacheDirectory | None) -> None:
        self.writer = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="concurrent-loader-cache"
        )
        self.directory = directory
        self.hits = self.misses = self.bytes_served = 0
        self._runtime: Runtime | None = None
        self._lock = threading.Lock()
        self._finishing = threading.Lock()
        self._done = False

    def runtime(self) -> Runtime:
        with self._lock:
            if self._runtime is None:
                self._runtime = acquire_runtime()
            return self._runtime

    def __call__(self) -> None:
        """Finish (never from a finalizer: :mod:`concurrent_loader.finish`); a second call
        returns once the first has finished."""
        with self._finishing:
            with self._lock:
                if self._done:
                    return
                self._done = True
                runtime, self._runtime = self._runtime, None
            self.writer.shutdown(wait=True)
            directory = self.directory
            if directory is not None:
                if self.hits or self.misses:
                    with contextlib.suppress(*CACHE_ERRORS):
                        directory.record_reads(self.hits, self.misses, self.bytes_served)
                directory.close()
            if runtime is not None:
                runtime.release()
