"""The cache as a store wrapping a store: :class:`CachedStore`, opened by
:class:`~.cached.CachedStoreConfig` at the bottom of the fetch client's layers.

``get(key)`` serves an intact entry; otherwise it GETs the object from the wrapped store
(``inner``, or the fetch client ``connect`` gives), returns it at once and writes the entry
behind (:mod:`.writer`). Guarantees:

- an entry is served only when all of it checks out (:mod:`.entry`); a range of a cached
  object is cut from it, a range of an object not cached is not cached;
- one GET per object across the node's processes missing it at once: the fill lock's holder
  fetches, others poll for its entry (1 to 50 ms, up to half of ``Timeouts.attempt``);
- a failing cache never fails a read: one WARNING per process and store, then reads go to
  the wrapped store;
- a miss counts once per read, however many GETs of it (a GET and its hedge) complete.

On the local path (``remote=False``) ``get_blocking`` serves hits on the decode threads and
sends a miss through :meth:`get` on the runtime's loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import multiprocessing.util
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator

from ..config import FetchConfig
from ..finish import EXIT_PRIORITY, later
from ..metrics.stats import cache_tally
from ..runtime import Runtime
from ..stores.base import Body, ByteRange, Capabilities, ObjectInfo, Store, StoreConfig
from .directory import CacheConfig, CacheDirectory, name_for
from .form import Apply, apply_in_thread, transformed
from .layout import CACHE_ERRORS, CorruptEntry, Entry, TooLarge
from .writer import MAX_ENTRY_BYTES, EntryWriter, Leftovers

__all__ = ["MAX_ENTRY_BYTES", "CachedStore", "Connect"]

log = logging.getLogger(__name__)

#: entries up to this size are read on the event loop's thread (a thread hop costs more
#: than reading an image); larger ones on a thread, so the loop never stalls on a big read
MAX_INLINE_READ_BYTES = 4 * 1024 * 1024
#: the longest wait for another process's GET of the same object
MAX_WAIT_S = 30.0
_FIRST_WAIT_S = 0.001
_LONGEST_WAIT_S = 0.05


#: one read of the wrapped store: ``Store.get``, or a fetch client's ``get_body``
Read = Callable[[str, ByteRange | None], Awaitable[Body]]
#: (on the runtime's loop) the read through this process's fetch client for that store
Connect = Callable[[Runtime], Awaitable[Read]]


class CachedStore:
    """Reads ``names``'s objects through the cache ``cache``, each entry's source named
    ``prefix`` + its URL. Use :meth:`get` on one loop."""

    def __init__(
        self,
        cache: CacheConfig,
        names: StoreConfig,
        fetch: FetchConfig,
        capabilities: Capabilities,
        prefix: str,
        inner: Store | None = None,
        connect: Connect | None = None,
    ) -> None:
        self.cache = cache
        self.names = names
        self._fetch = fetch
        self.capabilities = capabilities
        #: the wrapped store, if given open (closed with this one)
        self.inner = inner
        self._connect = connect
        self._get: Read | None = inner.get if inner is not None else None
        #: how a miss is put in the cache's form (``cache.presize``; :mod:`.form`)
        self.apply: Apply = apply_in_thread
        self._prefix = prefix
        self._max_wait_s = min(fetch.timeouts.attempt / 2, MAX_WAIT_S)
        self._tally = cache_tally()
        #: GETs in flight per object (or range), and whether their miss is counted yet
        self._missing: dict[tuple[str, ByteRange | None], list[int]] = {}
        self._warned = False
        self._locking = True
        self._closed = False
        #: the directory while reads use it (None once it failed)
        self._dir: CacheDirectory | None = None
        try:
            self._dir = CacheDirectory(cache)
        except CACHE_ERRORS as exc:
            self._fail(exc, "opening it")
        self._leftovers = Leftovers(self._dir)
        paused = "writes to it pause (retried after a back-off)"
        on_failure = functools.partial(self._warn, doing="writing an entry", consequence=paused)
        self._writer = EntryWriter(self._leftovers.writer, on_failure)
        # At collection (a store on the local path is never closed) or at a process's exit
        # (multiprocessing's exit hook, a worker's too): queued, as a finalizer must
        # (concurrent_loader.finish), and run on another thread or at that exit.
        self._at_exit = multiprocessing.util.Finalize(
            self, later, (self._leftovers,), exitpriority=EXIT_PRIORITY + 5
        )

    def url_for(self, key: str) -> str:
        return self.names.url_for(key)

    def __repr__(self) -> str:
        return f"CachedStore({self.names}, {self.cache.directory})"

    async def _fetch_inner(self, key: str, byte_range: ByteRange | None) -> Body:
        if self._get is None:
            assert self._connect is not None  # given one or the other
            self._get = await self._connect(self._leftovers.runtime())
        return await self._get(key, byte_range)

    # ------------------------------------------------------------------ reads

    async def get(self, key: str, byte_range: ByteRange | None = None) -> Body:
        directory = self._dir
        # With a transform, entries hold another form, whose ranges mean nothing.
        if directory is None or (byte_range is not None and self.cache.presize is not None):
            return await self._uncached(key, byte_range)
        source = self._prefix + self.url_for(key)
        name = name_for(source)
        entry, bad = await self._lookup(directory, name, source)
        if entry is not None:
            return await self._serve(entry, key, byte_range)
        if byte_range is not None:
            return await self._uncached(key, byte_range)
        return await self._fill(directory, key, name, source, replace=bad)

    async def _uncached(self, key: str, byte_range: ByteRange | None) -> Body:
        """A GET of the wrapped store; GETs of the same object (or range) that overlap in
        time (a GET and its hedge) are one miss."""
        read = (key, byte_range)
        group = self._missing.setdefault(read, [0, 0])  # [in flight, counted]
        group[0] += 1
        try:
            body = await self._fetch_inner(key, byte_range)
        finally:
            group[0] -= 1
            if not group[0]:
                del self._missing[read]
        if not group[1]:
            group[1] = 1
            self._leftovers.misses += 1
            self._tally.miss()
        return body

    def _read(
        self, directory: CacheDirectory, name: str, source: str, max_bytes: int | None = None
    ) -> tuple[Entry | None, bool]:
        try:
            return directory.read(name, source, max_bytes), False
        except CorruptEntry as exc:
            log.info("refetching %s: its cache entry is bad (%s)", source, exc)
            return None, True
        except CACHE_ERRORS as exc:
            self._fail(exc, "reading it")
            return None, False

    async def _lookup(
        self, directory: CacheDirectory, name: str, source: str
    ) -> tuple[Entry | None, bool]:
        try:
            return self._read(directory, name, source, MAX_INLINE_READ_BYTES)
        except TooLarge:
            return await asyncio.to_thread(self._read, directory, name, source)

    def _hit(self, entry: Entry, byte_range: ByteRange | None) -> bytes | bytearray | None:
        """The entry's bytes (of ``byte_range``), counted as a hit; None past its end."""
        data: bytes | bytearray = entry.data
        if byte_range is not None:
            if byte_range.end > len(data):
                return None
            data = data[byte_range.start : byte_range.end]
        self._leftovers.hits += 1
        self._leftovers.bytes_served += len(data)
        self._tally.hit(len(data))
        return data

    async def _serve(self, entry: Entry, key: str, byte_range: ByteRange | None) -> Body:
        data = self._hit(entry, byte_range)
        if data is None:  # the store says what is wrong with the range
            return await self._uncached(key, byte_range)
        return Body(data, None, entry.etag, round_trip=False)

    # ------------------------------------------------------------------ misses

    async def _fill(
        self, directory: CacheDirectory, key: str, name: str, source: str, *, replace: bool
    ) -> Body:
        """Fetch the object, holding its fill lock (or wait for the process that does)."""
        try:
            held = self._locking and directory.try_fill_lock(name)
        except CACHE_ERRORS as exc:  # a filesystem without locks: go on, without them
            held = self._no_locks(exc)
        waited = not held and self._locking
        if waited:
            entry, held = await self._wait_for_filler(directory, name, source)
            if entry is not None:
                return await self._serve(entry, key, None)
        if held and (waited or not replace):
            # Another process may have put it in place since our lookup.
            entry, _ = await self._lookup(directory, name, source)
            if entry is not None:
                self._release(directory, name)
                return await self._serve(entry, key, None)
        release = functools.partial(self._release, directory, name) if held else lambda: None
        try:
            body = await self._uncached(key, None)
            if self.cache.presize is not None:  # an error: not cached (the lock released)
                body = await transformed(self.cache.presize, body, self.url_for(key), self.apply)
        except BaseException:
            release()
            raise
        if self._closed:
            release()
        else:  # the fill lock goes once the entry is in place
            self._writer.submit(directory, name, source, body, release, replace=replace)
        return body

    async def _wait_for_filler(
        self, directory: CacheDirectory, name: str, source: str
    ) -> tuple[Entry | None, bool]:
        """Wait for the process holding the fill lock: (its entry, False) once in place;
        (None, True) when the lock came free (we hold it now); (None, False) after
        ``_max_wait_s``. No portable cross-process wake-up exists without a server,
        so this backs off and looks again."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._max_wait_s
        delay = _FIRST_WAIT_S
        while True:
            await asyncio.sleep(delay)
            entry, _ = await self._lookup(directory, name, source)
            if entry is not None:
                return entry, False
            try:
                if directory.try_fill_lock(name):
                    return None, True
            except CACHE_ERRORS as exc:
                return None, self._no_locks(exc)
            if loop.time() >= deadline:
                log.info("%s: gave up waiting for another process to fetch it", source)
                return None, False
            delay = min(delay * 2, _LONGEST_WAIT_S)

    def _no_locks(self, exc: Exception) -> bool:
        self._locking = False
        self._warn(exc, "locking an object", "objects missed together are fetched twice")
        return False

    def _release(self, directory: CacheDirectory, name: str) -> None:
        try:
            directory.release_fill_lock(name)
        except CACHE_ERRORS as exc:
            self._fail(exc, "unlocking an object")

    # ------------------------------------------------------------------ failures, counts

    def _fail(self, exc: Exception, doing: str) -> None:
        self._dir = None
        self._warn(exc, doing, "reads bypass it")

    def _warn(self, exc: Exception, doing: str, consequence: str) -> None:
        if not self._warned:
            self._warned = True
            log.warning(
                "the cache at %s failed while %s (%s): %s in this process; %s is read "
                "from the store",
                self.cache.directory,
                doing,
                exc,
                consequence,
                self.url_for(""),
            )

    # ------------------------------------------------------------------ the rest

    def list(self) -> AsyncIterator[ObjectInfo]:
        assert self.inner is not None, "off the remote path, lists go through the config"
        return self.inner.list()

    async def flush(self) -> None:
        with contextlib.suppress(RuntimeError):  # shut down: nothing is pending
            await asyncio.wrap_future(self._leftovers.writer.submit(lambda: None))

    async def close(self) -> None:
        """Finish pending writes, record this store's reads in the ledger, close. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._dir = None
        try:
            done = asyncio.get_running_loop().run_in_executor(None, self._leftovers)
        except RuntimeError:  # no new job at interpreter exit: finished here
            self._leftovers()
        else:
            await done
        if self.inner is not None:
            await self.inner.close()

    # ------------------------------------------------------------------ the local path

    def get_blocking(self, key: str, byte_range: ByteRange | None = None) -> bytes | bytearray:
        """On a decode thread: the intact entry, or else :meth:`get` on the runtime's loop,
        waiting for the entry to be written."""
        directory = self._dir
        if directory is not None and (byte_range is None or self.cache.presize is None):
            source = self._prefix + self.url_for(key)
            entry, _ = self._read(directory, name_for(source), source)
            if entry is not None and (data := self._hit(entry, byte_range)) is not None:
                return data

        async def miss() -> bytes | bytearray:
            body = await self.get(key, byte_range)
            await self.flush()  # written before this thread reads on
            return body.data

        return self._leftovers.runtime().run(miss())

    def list_blocking(self) -> Iterator[ObjectInfo]:
        from ..listing import list_store

        return iter(list_store(self.names, self._fetch))
