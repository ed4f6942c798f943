"""The cache directory shared by every process on the node: entries, a ledger, fill locks.

Layout::

    DIR/ledger           bytes and entries held, and reads served, in one small record
    DIR/locks            one byte-range lock per object being fetched (never any data)
    DIR/entries/ab/NAME  one entry per object (:mod:`.entry`); NAME is a hash of its source
    DIR/tmp/             entries being written

Guarantees, across processes, without a server:

- Readers take no lock: an entry appears whole (written under ``tmp/``, then
  ``os.replace``d into place) or not at all, and a reader checks every entry it reads
  (:func:`~.entry.read_entry`). A process killed while writing leaves only a file in
  ``tmp/``, which no reader opens; ones older than ``STALE_TEMP_S`` are removed when a
  process opens the cache.
- The budget: every change to ``entries/`` (adding, replacing, evicting, removing an entry)
  happens under an exclusive ``flock`` of the ledger, which is updated before the entry is
  renamed into place, so the bytes in ``entries/`` never exceed the budget; a process killed
  between the two leaves the ledger counting an entry that is not there (the budget is
  under-used by one object, never overrun). A missing or unreadable ledger is rebuilt from
  a scan.
- Fill locks: a process about to fetch an object holds an exclusive ``lockf`` lock on one
  byte of ``locks`` (chosen by the object's name) until its entry is in place, so other
  processes missing the same object wait for it instead of fetching it again. The kernel
  drops the lock of a process that dies. The locks only save GETs; correctness never
  depends on them.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import itertools
import os
import shutil
import struct
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from .config import CacheConfig

__all__ = [
    "CacheDirectory",
    "Ledger",
    "clear_cache",
    "describe_cache",
    "entry_path",
    "ledger_bytes",
    "ledger_entries",
    "name_for",
]

_LEDGER = struct.Struct("<4sqqqqq")
_LEDGER_MAGIC = b"CLL1"
#: a temporary file this old belongs to a writer that died (a write takes milliseconds)
STALE_TEMP_S = 600.0
#: LRU eviction frees this share of the budget beyond what the new entry needs, so the
#: directory is scanned once per many entries, not once per entry
EVICT_SLACK = 0.1
_temp_names = itertools.count()


def entry_path(root: str, name: str) -> str:
    """Where the entry ``name`` lives under the cache directory ``root``."""
    return os.path.join(root, "entries", name[:2], name)


def name_for(source: str) -> str:
    """The entry name of an object: a hash of its source (endpoint and URL)."""
    return hashlib.blake2b(source.encode(), digest_size=16).hexdigest()


@dataclass
class Ledger:
    """The shared record: bytes and entries in ``entries/``, and reads served so far."""

    used: int = 0
    entries: int = 0
    hits: int = 0
    misses: int = 0
    bytes_served: int = 0

    def pack(self) -> bytes:
        return _LEDGER.pack(
            _LEDGER_MAGIC, self.used, self.entries, self.hits, self.misses, self.bytes_served
        )

    @classmethod
    def unpack(cls, raw: bytes) -> Ledger | None:
        if len(raw) != _LEDGER.size:
            return None
        magic, *fields = _LEDGER.unpack(raw)
        if magic != _LEDGER_MAGIC or min(fields) < 0:
            return None
        return cls(*fields)


class CacheDirectory:
    """One process's handle on a cache directory (made and used inside that process).

    Every method may raise ``OSError`` (a full disk, a permission, a deleted directory);
    the store using it turns that into one warning and goes on uncached.
    """

    def __init__(self, config: CacheConfig) -> None:
        self.root = config.directory
        self.budget = config.budget
        self.policy = config.policy
        self._entries = os.path.join(self.root, "entries")
        self._tmp = os.path.join(self.root, "tmp")
        os.makedirs(self._entries, exist_ok=True)
        os.makedirs(self._tmp, exist_ok=True)
        self._ledger_fd = os.open(os.path.join(self.root, "ledger"), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            self._locks_fd = os.open(os.path.join(self.root, "locks"), os.O_RDWR | os.O_CREAT)
        except BaseException:
            os.close(self._ledger_fd)
            raise
        # flock excludes other open files, not threads sharing this one.
        self._mutex = threading.Lock()
        self._closed = False
        self._remove_stale_temps()

    def close(self) -> None:
        """Close the files (dropping this process's fill locks). Idempotent."""
        if not self._closed:
            self._closed = True
            os.close(self._locks_fd)
            os.close(self._ledger_fd)

    # ------------------------------------------------------------------ read side (no lock)

    def path_for(self, name: str) -> str:
        return entry_path(self.root, name)

    def looks_full(self, size: int) -> bool:
        """Whether an entry of ``size`` bytes would not fit now, read without the lock (a
        hint that saves writing an entry the fill policy would refuse)."""
        ledger = Ledger.unpack(os.pread(self._ledger_fd, _LEDGER.size, 0))
        return ledger is not None and ledger.used + size > self.budget

    def touch(self, name: str) -> None:
        """Mark an entry as just read (the LRU order)."""
        with contextlib.suppress(FileNotFoundError):
            os.utime(self.path_for(name))

    # ------------------------------------------------------------------ fill locks

    def try_fill_lock(self, name: str) -> bool:
        """Take the fill lock of ``name`` if no other process holds it."""
        try:
            fcntl.lockf(self._locks_fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, _lock_offset(name))
        except OSError as exc:
            if exc.errno in (errno.EACCES, errno.EAGAIN):
                return False
            raise
        return True

    def release_fill_lock(self, name: str) -> None:
        if not self._closed:
            fcntl.lockf(self._locks_fd, fcntl.LOCK_UN, 1, _lock_offset(name))

    # ------------------------------------------------------------------ write side (locked)

    @contextlib.contextmanager
    def _locked_ledger(self) -> Iterator[Ledger]:
        """The ledger, exclusively; what the body changes in it is written back."""
        with self._mutex:
            fcntl.flock(self._ledger_fd, fcntl.LOCK_EX)
            try:
                ledger = Ledger.unpack(os.pread(self._ledger_fd, _LEDGER.size, 0))
                if ledger is None:
                    ledger = self._scan_ledger()
                yield ledger
                self._save(ledger)
            finally:
                fcntl.flock(self._ledger_fd, fcntl.LOCK_UN)

    def _save(self, ledger: Ledger) -> None:
        os.pwrite(self._ledger_fd, ledger.pack(), 0)

    def _scan_ledger(self) -> Ledger:
        ledger = Ledger()
        for _, size, _ in _scan_entries(self._entries):
            ledger.used += size
            ledger.entries += 1
        return ledger

    def put(self, name: str, data: bytes | bytearray, tail: bytes, *, replace: bool) -> bool:
        """Add the entry ``name`` (``data`` then ``tail``) if the budget allows, evicting
        for it under the LRU policy. ``replace``: the entry now in place (if any) is known
        bad or stale, so it goes even when the new one does not fit. True if added."""
        size = len(data) + len(tail)
        temp = os.path.join(
            self._tmp, f"{name}.{os.getpid()}.{threading.get_ident()}.{next(_temp_names)}"
        )
        _write_file(temp, data, tail)
        try:
            with self._locked_ledger() as ledger:
                path = self.path_for(name)
                old = _size_or_none(path)
                used = ledger.used - (old or 0)
                if used + size > self.budget and self.policy == "lru":
                    used = self._evict(ledger, used, size, keep=path)
                if used + size > self.budget:
                    if replace and old is not None:
                        os.unlink(path)
                        ledger.entries -= 1
                    else:
                        used += old or 0
                    ledger.used = used
                    return False
                ledger.used = used + size
                ledger.entries += 0 if old is not None else 1
                # The ledger first: a kill between the two over-counts, never under-counts.
                self._save(ledger)
                os.makedirs(os.path.dirname(path), exist_ok=True)
                os.replace(temp, path)
                return True
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(temp)

    def remove(self, name: str) -> None:
        """Remove an entry found bad (it will not be read again)."""
        with self._locked_ledger() as ledger:
            path = self.path_for(name)
            old = _size_or_none(path)
            if old is not None:
                os.unlink(path)
                ledger.used -= old
                ledger.entries -= 1

    def _evict(self, ledger: Ledger, used: int, size: int, *, keep: str) -> int:
        """Unlink the least recently read entries until ``size`` more bytes fit with
        ``EVICT_SLACK`` of the budget to spare; returns the bytes left in use."""
        target = max(0, self.budget - size - int(EVICT_SLACK * self.budget))
        for path, entry_size, _ in sorted(_scan_entries(self._entries), key=lambda e: e[2]):
            if used <= target:
                break
            if path == keep:
                continue
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
                used -= entry_size
                ledger.entries -= 1
        return used

    def record_reads(self, hits: int, misses: int, bytes_served: int) -> None:
        """Add this process's reads to the ledger's totals (for ``cache info``)."""
        if hits or misses:
            with self._locked_ledger() as ledger:
                ledger.hits += hits
                ledger.misses += misses
                ledger.bytes_served += bytes_served

    def _remove_stale_temps(self) -> None:
        cutoff = time.time() - STALE_TEMP_S
        with os.scandir(self._tmp) as found:
            for item in found:
                with contextlib.suppress(FileNotFoundError):
                    if item.stat().st_mtime < cutoff:
                        os.unlink(item.path)


def _lock_offset(name: str) -> int:
    return int(name[:8], 16)


def _size_or_none(path: str) -> int | None:
    try:
        return os.stat(path).st_size
    except FileNotFoundError:
        return None


def _write_file(path: str, data: bytes | bytearray, tail: bytes) -> None:
    """``data`` then ``tail`` into a new file at ``path`` (removed again on failure)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        try:
            with memoryview(data) as view:
                _write_all(fd, view)
            _write_all(fd, memoryview(tail))
        finally:
            os.close(fd)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        raise


def _write_all(fd: int, view: memoryview) -> None:
    while view:
        view = view[os.write(fd, view) :]


def _scan_entries(entries: str) -> Iterator[tuple[str, int, float]]:
    """(path, size, mtime) of every entry file."""
    try:
        shards = list(os.scandir(entries))
    except FileNotFoundError:
        return
    for shard in shards:
        if not shard.is_dir():
            continue
        with os.scandir(shard.path) as found:
            for item in found:
                with contextlib.suppress(FileNotFoundError):
                    stat = item.stat()
                    yield item.path, stat.st_size, stat.st_mtime


# ---------------------------------------------------------------------- for the command line


def _is_cache(directory: str) -> bool:
    return os.path.isfile(os.path.join(directory, "ledger"))


def _read_ledger(directory: str) -> Ledger | None:
    """The ledger, read without its lock (None when there is none, or it cannot be read)."""
    try:
        with open(os.path.join(directory, "ledger"), "rb") as f:
            return Ledger.unpack(f.read(_LEDGER.size))
    except OSError:
        return None


def ledger_bytes(directory: str) -> int:
    """The bytes a cache directory's ledger says it holds (0 for none, or no cache)."""
    ledger = _read_ledger(directory)
    return ledger.used if ledger is not None else 0


def ledger_entries(directory: str) -> int:
    """The entries a cache directory's ledger counts (0 for none, or no cache)."""
    ledger = _read_ledger(directory)
    return ledger.entries if ledger is not None else 0


def describe_cache(directory: str) -> dict[str, Any]:
    """What a cache directory holds (a scan) and what its ledger says; ``ValueError`` if it
    is not a cache directory."""
    directory = os.path.abspath(directory)
    if not _is_cache(directory):
        raise ValueError(f"{directory} is not a cache directory (no ledger)")
    with open(os.path.join(directory, "ledger"), "rb") as f:
        ledger = Ledger.unpack(f.read())
    scanned = list(_scan_entries(os.path.join(directory, "entries")))
    temps = len(os.listdir(os.path.join(directory, "tmp")))
    reads = (ledger.hits + ledger.misses) if ledger else 0
    return {
        "directory": directory,
        "entries": len(scanned),
        "bytes": sum(size for _, size, _ in scanned),
        "ledger_bytes": ledger.used if ledger else None,
        "temporary_files": temps,
        "hits": ledger.hits if ledger else 0,
        "misses": ledger.misses if ledger else 0,
        "bytes_served": ledger.bytes_served if ledger else 0,
        "hit_rate": ledger.hits / reads if ledger and reads else None,
    }


def clear_cache(directory: str) -> int:
    """Remove every entry (and temporary file) and zero the ledger, under its lock;
    returns the entries removed. ``ValueError`` if it is not a cache directory."""
    directory = os.path.abspath(directory)
    if not _is_cache(directory):
        raise ValueError(f"{directory} is not a cache directory (no ledger)")
    fd = os.open(os.path.join(directory, "ledger"), os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        removed = sum(1 for _ in _scan_entries(os.path.join(directory, "entries")))
        for sub in ("entries", "tmp"):
            shutil.rmtree(os.path.join(directory, sub), ignore_errors=True)
            os.makedirs(os.path.join(directory, sub), exist_ok=True)
        os.pwrite(fd, Ledger().pack(), 0)
        return removed
    finally:
        os.close(fd)
