"""What a cached store leaves to finish when it goes: pending writes, its reads for the
ledger, the directory's files, a runtime lease. Kept apart from the store (and holding no
reference to it) so it can run when the store is collected, which is how a store on the
local path ends: the pipeline never closes a blocking store."""

from __future__ import annotations

import concurrent.futures
import contextlib
import threading

from ..runtime import Runtime, acquire_runtime
from .directory import CacheDirectory
from .layout import CACHE_ERRORS

__all__ = ["Leftovers"]


class Leftovers:
    """What a store leaves to finish: pending writes, its reads for the ledger, the
    directory's files, a runtime lease taken on the local path. Called once, from
    ``close()``, collection or process exit; holds no reference to the store."""

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
        """This process's runtime, leased until this is called."""
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
