"""A node-local object cache shared by every worker process and job on the node.

A store wrapping the root's store (:class:`CachedStoreConfig`), so retries, limits, the
pipeline and the loader do not change. It fills until its budget is reached and never
evicts. Guarantees: :mod:`.store` (reads), :mod:`.directory` (sharing, budget, crashes,
fork), :mod:`.layout` (no link followed; integrity), :mod:`.writer`. Only a marked cache
directory is described or cleared (anything else is refused with ``CacheRefused``, naming
it); clearing removes only what the cache wrote: entries, their shard directories, and dead
writers' temporary files.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
from collections.abc import Awaitable, Callable
from typing import Any

from ..config import FetchConfig
from ..runtime import Runtime
from ..stores.base import StoreConfig
from .cached import CachedStoreConfig, Client
from .directory import CacheConfig, CacheDirectory, Ledger, read_ledger, remove_dead_temps
from .form import Transform, clear_forms, read_forms, record_form
from .layout import SHARD_NAME, CacheRefused, Handles, on_entry, scan_entries, temp_files
from .store import CachedStore

__all__ = ["CacheConfig", "CacheDirectory", "CacheRefused", "CachedStore", "CachedStoreConfig"]
__all__ += ["Transform", "clear_cache", "describe_cache", "with_cache"]

log = logging.getLogger(__name__)


def with_cache(
    store: StoreConfig,
    cache: str | os.PathLike[str] | CacheConfig | None,
    client_for: Callable[[Runtime, StoreConfig, FetchConfig], Awaitable[Client]] | None = None,
) -> StoreConfig:
    """``store`` read through ``cache`` (a directory or a ``CacheConfig``), the directory
    made and the budget fixed here in the main process; ``store`` itself when ``cache`` is
    None, the store is local, or the directory cannot be made (one WARNING). A directory
    that is not a cache is refused with ``CacheRefused`` (a ``ConfigError``).
    ``client_for``: see :attr:`CachedStoreConfig.client_for`."""
    if cache is None:
        return store
    if not isinstance(cache, CacheConfig):  # a directory: the defaults (CacheConfig checks it)
        cache = CacheConfig(os.fspath(cache) if isinstance(cache, os.PathLike) else cache)
    if not store.capabilities.remote:
        log.info("%s is on local disk: not cached", store)
        return store
    try:
        directory = os.path.abspath(os.path.expanduser(cache.directory))
        Handles.open(directory, create=True).close()  # marks, lays out; refuses a user's
        resolved = cache.resolved(read_ledger(directory).used)
        record_form(directory, cache.presize)  # for `cache info`
    except OSError as exc:
        log.warning(
            "the cache at %s cannot be used (%s): %s is read from the store",
            cache.directory,
            exc,
            store,
        )
        return store
    return CachedStoreConfig(store, resolved, client_for=client_for)


def describe_cache(directory: str) -> dict[str, Any]:
    """What a cache directory holds (a scan), the forms its entries were kept in
    (:mod:`.form`) and what its ledger says; ``CacheRefused`` if it is not a cache."""
    directory = os.path.abspath(directory)
    handles = Handles.open(directory, create=False)
    try:
        ledger = Ledger.read(handles.ledger_fd)
        scanned = list(scan_entries(handles.entries_fd, directory))
        temps = sum(1 for _ in temp_files(handles.tmp_fd))
        forms = read_forms(handles.root_fd, directory)
    finally:
        handles.close()
    counts = ledger or Ledger()
    reads = counts.hits + counts.misses
    return {
        "directory": directory,
        "forms": forms,
        "entries": len(scanned),
        "bytes": sum(size for _, size in scanned),
        "ledger_bytes": ledger.used if ledger else None,
        "temporary_files": temps,
        "hits": counts.hits,
        "misses": counts.misses,
        "bytes_served": counts.bytes_served,
        "hit_rate": counts.hits / reads if reads else None,
    }


def clear_cache(directory: str) -> int:
    """Remove every entry and dead writer's temporary file the cache wrote and zero the
    ledger, under its lock; the entries removed. ``CacheRefused`` if it is not a cache."""
    handles = Handles.open(os.path.abspath(directory), create=False)
    root, entries_fd = handles.root, handles.entries_fd
    try:
        fcntl.flock(handles.ledger_fd, fcntl.LOCK_EX)
        names = [name for name, _ in scan_entries(entries_fd, root)]
        removed = sum(on_entry(entries_fd, name, root, os.unlink) for name in names)
        with os.scandir(entries_fd) as shards:
            for shard in [s.name for s in shards if SHARD_NAME.fullmatch(s.name)]:
                with contextlib.suppress(OSError):  # not empty, or a link (never followed)
                    os.rmdir(shard, dir_fd=entries_fd)
        remove_dead_temps(handles.tmp_fd)
        clear_forms(handles.root_fd)
        os.pwrite(handles.ledger_fd, Ledger().pack(), 0)
        return removed
    finally:
        # Explicitly: a forked child may hold a copy of this file (and so of its lock).
        fcntl.flock(handles.ledger_fd, fcntl.LOCK_UN)
        handles.close()
