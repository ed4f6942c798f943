"""A cache directory from the command line and the main process: what it holds and emptying it.

Only a marked cache directory (:mod:`.layout`) is described or cleared; anything else is
refused with :class:`~.layout.CacheRefused`, naming it. Clearing removes only what the cache
wrote: entries, their shard directories, and dead writers' temporary files.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from typing import Any

from .directory import Ledger, remove_dead_temps
from .form import clear_forms, read_forms
from .layout import SHARD_NAME, Handles, scan_entries, temp_files, unlink_entry

__all__ = ["clear_cache", "describe_cache", "ledger_bytes", "read_ledger"]


def read_ledger(directory: str) -> Ledger:
    """A cache directory's ledger, read without its lock (empty for none, or no cache)."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(os.path.join(directory, "ledger"), flags)
    except OSError:
        return Ledger()
    try:
        return Ledger.read(fd) or Ledger()
    except OSError:
        return Ledger()
    finally:
        os.close(fd)


def ledger_bytes(directory: str) -> int:
    return read_ledger(directory).used


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
        removed = sum(
            unlink_entry(entries_fd, name, root) for name, _ in list(scan_entries(entries_fd, root))
        )
        with os.scandir(entries_fd) as shards:
            for shard in [s.name for s in shards if SHARD_NAME.fullmatch(s.name)]:
                with contextlib.suppress(OSError):  # not empty, or a link (never followed)
                    os.rmdir(shard, dir_fd=entries_fd)
        remove_dead_temps(handles.tmp_fd)
        clear_forms(handles.root_fd, root)
        os.pwrite(handles.ledger_fd, Ledger().pack(), 0)
        return removed
    finally:
        # Explicitly: a forked child may hold a copy of this file (and so of its lock).
        fcntl.flock(handles.ledger_fd, fcntl.LOCK_UN)
        handles.close()
