"""What a cached store leaves to finish when it goes, kept apart from the store so it can
run when the store is collected: a store on the local path is never closed."""

from __future__ import annotations

import concurrent.futures
import contextlib
import threading

from ..runtime import Runtime, acquire_runtime
from .directory import CacheDirectory
from .layout import CACHE_ERRORS

__all__ = ["Leftovers"]


class Leftovers:
    """Pending writes, reads for the ledger, the directory's files, a runtime lease; called
    once, from ``close()``, collection or process exit."""

    def __init__(self, directory: CacheDirectory | None) -> None:
        self.writer = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="concurrent-loader-cache"
        )
        self.directory = directory
        self.hits = self.misses = self.bytes_served = 0
        self._runtime: Runtime | None = None
        self._lock = threading.Lock()
        self._done = False

    def runtime(self) -> Runtime:
        with self._lock:
            if self._runtime is None:
                self._runtime = acquire_runtime()
            return self._runtime

    def __call__(self) -> None:
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
