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
from .layout import (
    SHARD_NAME,
    Handles,
    scan_entries,
    temp_files,
    unlink_entry,
)

__all__ = ["clear_cache", "describe_cache", "ledger_bytes", "ledger_entries"]


def _read_ledger(directory: str) -> Ledger | None:
    """The ledger, read without its lock (None when there is none, or it cannot be read)."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(os.path.join(directory, "ledger"), flags)
    except OSError:
        return None
    try:
        return Ledger.unpack(os.pread(fd, Ledger.SIZE, 0))
    except OSError:
        return None
    finally:
        os.close(fd)


def ledger_bytes(directory: str) -> int:
    """The bytes a cache directory's ledger says it holds (0 for none, or no cache)."""
    ledger = _read_ledger(directory)
    return ledger.used if ledger is not None else 0


def ledger_entries(directory: str) -> int:
    """The entries a cache directory's ledger counts (0 for none, or no cache)."""
    ledger = _read_ledger(directory)
    return ledger.entries if ledger is not None else 0


def describe_cache(directory: str) -> dict[str, Any]:
    """What a cache directory holds (a scan), the forms its entries were kept in
    (``forms``: ``original`` and transforms' identities, :mod:`.form`; [] when none is
    recorded) and what its ledger says;
    ``CacheRefused`` if it is not a cache directory."""
    directory = os.path.abspath(directory)
    handles = Handles.open(directory, create=False)
    try:
        ledger = Ledger.unpack(os.pread(handles.ledger_fd, Ledger.SIZE, 0))
        scanned = list(scan_entries(handles.entries_fd, directory))
        temps = sum(1 for _ in temp_files(handles.tmp_fd))
        forms = read_forms(handles.root_fd, directory)
    finally:
        handles.close()
    reads = (ledger.hits + ledger.misses) if ledger else 0
    return {
        "directory": directory,
        "forms": forms,
        "entries": len(scanned),
        "bytes": sum(size for _, size in scanned),
        "ledger_bytes": ledger.used if ledger else None,
        "temporary_files": temps,
        "hits": ledger.hits if ledger else 0,
        "misses": ledger.misses if ledger else 0,
        "bytes_served": ledger.bytes_served if ledger else 0,
        "hit_rate": ledger.hits / reads if ledger and reads else None,
    }


def clear_cache(directory: str) -> int:
    """Remove every entry and dead writer's temporary file the cache wrote and zero the
    ledger, under its lock; returns the entries removed. Files the cache did not write
    stay. ``CacheRefused`` if it is not a cache directory."""
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
