"""The cache directory shared by every process on the node: entries, a ledger, fill locks.

What a cache is (:class:`CacheConfig`): a directory and a byte budget, resolved once in the
main process when the dataset is made, so every worker enforces the same figure.

Layout (:mod:`.layout` says how it is marked and opened)::

    DIR/CACHEDIR.TAG     the marker: a cache, and its format
    DIR/ledger           bytes and entries held, and reads served, in one small record
    DIR/locks            one byte-range lock per object being fetched (never any data)
    DIR/entries/ab/NAME  one entry per object (:mod:`.layout`); NAME is a hash of its source
    DIR/tmp/             entries being written

Guarantees, across processes, without a server:

- reads take no lock: entries are written under ``tmp/`` and renamed into place, and every
  read checks its entry; a killed writer's ``tmp/`` file is removed after ``STALE_TEMP_S``;
- the budget: every change to ``entries/`` happens under an exclusive ``flock`` of the
  ledger, updated before the rename, so ``entries/`` never exceeds it (a kill in between
  under-uses it); a bad ledger is rebuilt from a scan;
- fill locks (one ``lockf`` byte of ``locks`` per object being fetched) only save GETs:
  correctness never depends on them;
- a forked child closes the files it inherited (a ``flock`` belongs to the shared open file
  description), opens its own on first use, and makes its thread locks anew.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import fcntl
import hashlib
import itertools
import os
import struct
import threading
import time
import weakref
from collections.abc import Iterator
from dataclasses import dataclass

from ..config import check_count
from ..errors import ConfigError
from .form import Transform, check_transform
from .layout import CorruptEntry, Entry, Handles, in_shard, read_entry_fd, scan_entries, temp_files

__all__ = ["CacheConfig", "CacheDirectory", "Ledger", "entry_path", "name_for"]
__all__ += ["read_ledger", "remove_dead_temps"]

#: the share of the disk's free space (plus what the cache already holds) that a cache
#: without ``max_bytes`` may use
DEFAULT_DISK_SHARE = 0.8


@dataclass(frozen=True)
class CacheConfig:
    """A node-local object cache in ``directory``, shared by every process that names it.

    - ``max_bytes``: the budget in bytes on disk, across every process using the directory;
      None: 80 % of the disk's free space plus what the cache holds, when the dataset is made.
    - ``presize``: keep each object in this form instead (``apply(data, url) -> bytes`` and
      a stable ``identity``, such as ``Presize(short_side=256)``; :mod:`.form`).

    The cache fills until the budget is reached and never evicts, so under random sampling
    the hit rate is budget / dataset every epoch. An entry is never revalidated: clear the
    cache (``concurrent-loader cache clear DIR``) after changing a dataset in place.
    """

    directory: str
    max_bytes: int | None = None
    presize: Transform | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.directory, str) or not self.directory:
            raise ConfigError(f"cache directory must be a non-empty path, got {self.directory!r}")
        if self.max_bytes is not None:
            check_count("cache max_bytes", self.max_bytes, 0)
        if self.presize is not None:
            check_transform(self.presize)

    def resolved(self, held_bytes: int = 0) -> CacheConfig:
        """This config with an absolute directory and a budget in bytes; ``held_bytes``, what
        the cache already holds, counts as free for the default budget."""
        directory = os.path.abspath(os.path.expanduser(self.directory))
        budget = self.max_bytes
        if budget is None:
            stat = os.statvfs(directory)
            budget = int(DEFAULT_DISK_SHARE * (stat.f_bavail * stat.f_frsize + held_bytes))
        return dataclasses.replace(self, directory=directory, max_bytes=budget)

    @property
    def budget(self) -> int:
        if self.max_bytes is None:
            raise ValueError("the cache's budget is resolved when a dataset is made")
        return self.max_bytes


_LEDGER = struct.Struct("<4sqqqqq")
_LEDGER_MAGIC = b"CLL2"
#: a temporary file this old belongs to a writer that died (a write takes milliseconds)
STALE_TEMP_S = 600.0
_temp_names = itertools.count()


def entry_path(root: str, name: str) -> str:
    return os.path.join(root, "entries", name[:2], name)


def name_for(source: str) -> str:
    """The entry name of an object: a hash of its source (where it is read from)."""
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
    def read(cls, fd: int) -> Ledger | None:
        return cls.unpack(os.pread(fd, _LEDGER.size, 0))

    @classmethod
    def unpack(cls, raw: bytes) -> Ledger | None:
        if len(raw) != _LEDGER.size:
            return None
        magic, *fields = _LEDGER.unpack(raw)
        if magic != _LEDGER_MAGIC or min(fields) < 0:
            return None
        return cls(*fields)


def read_ledger(directory: str) -> Ledger:
    """A cache directory's ledger, read without its lock (empty for none, or no cache)."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(os.path.join(directory, "ledger"), flags)
        try:
            return Ledger.read(fd) or Ledger()
        finally:
            os.close(fd)
    except OSError:
        return Ledger()


#: every open directory of this process, so a forked child can let go of its copies
_OPEN: weakref.WeakSet[CacheDirectory] = weakref.WeakSet()


class CacheDirectory:
    """One process's handle on a cache directory. Every method may raise ``OSError``, and
    opening :class:`~.layout.CacheRefused` for a directory that is not a cache it may use."""

    def __init__(self, config: CacheConfig) -> None:
        self.root = config.directory
        self.budget = config.budget
        self._handles = Handles.open(self.root, create=True)
        self._retired: list[Handles] = []  # given up for newer ones, maybe still in use
        # flock excludes other open files, not threads sharing this one.
        self._mutex = threading.Lock()
        self._reopening = threading.Lock()
        self._closed = False
        _OPEN.add(self)
        try:
            remove_dead_temps(self._handles.tmp_fd)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Close the files (dropping this process's fill locks). Idempotent."""
        if not self._closed:
            self._closed = True
            _OPEN.discard(self)
            for handles in [self._handles, *self._retired]:
                if handles.pid == os.getpid():
                    handles.close()

    def _h(self) -> Handles:
        handles = self._handles
        if handles.pid != os.getpid():
            with self._reopening:
                handles = self._handles
                if handles.pid != os.getpid():
                    handles = self._handles = Handles.open(self.root, create=True)
        return handles

    def refresh(self) -> None:
        """Open the directory again if it was removed (and made again) since it was opened."""
        handles = self._h()
        if handles.replaced():
            with self._reopening:
                if self._handles is handles:
                    self._handles = Handles.open(self.root, create=True)
                    self._retired.append(handles)

    # ------------------------------------------------------------------ read side (no lock)

    def read(self, name: str, source: str, max_bytes: int | None = None) -> Entry | None:
        """The entry ``name`` for ``source``, or None; raises as :func:`~.layout.read_entry_fd`."""
        flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        path = entry_path(self.root, name)
        try:
            with in_shard(self._h().entries_fd, name, self.root) as shard_fd:
                fd = os.open(name, flags, dir_fd=shard_fd)
        except FileNotFoundError:
            return None
        except OSError as exc:
            if exc.errno != errno.ELOOP:
                raise
            raise CorruptEntry(f"{path}: a symbolic link, not an entry") from None
        try:
            return read_entry_fd(fd, path, source, max_bytes)
        finally:
            os.close(fd)

    def looks_full(self, size: int) -> bool:
        """Whether an entry of ``size`` bytes would not fit now (a hint, read without the lock)."""
        ledger = Ledger.read(self._h().ledger_fd)
        return ledger is not None and ledger.used + size > self.budget

    # ------------------------------------------------------------------ fill locks

    def try_fill_lock(self, name: str) -> bool:
        try:
            fcntl.lockf(self._h().locks_fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, _lock_offset(name))
        except (BlockingIOError, PermissionError):
            return False
        return True

    def release_fill_lock(self, name: str) -> None:
        if not self._closed:
            fcntl.lockf(self._h().locks_fd, fcntl.LOCK_UN, 1, _lock_offset(name))

    # ------------------------------------------------------------------ write side (locked)

    @contextlib.contextmanager
    def _locked_ledger(self, handles: Handles) -> Iterator[Ledger]:
        with self._mutex:
            fcntl.flock(handles.ledger_fd, fcntl.LOCK_EX)
            try:
                ledger = Ledger.read(handles.ledger_fd)
                if ledger is None:
                    ledger = Ledger()
                    for _, size in scan_entries(handles.entries_fd, self.root):
                        ledger.used += size
                        ledger.entries += 1
                yield ledger
                os.pwrite(handles.ledger_fd, ledger.pack(), 0)
            finally:
                fcntl.flock(handles.ledger_fd, fcntl.LOCK_UN)

    def put(self, name: str, data: bytes | bytearray, tail: bytes, *, replace: bool) -> bool:
        """Add the entry ``name`` (``data`` then ``tail``) if the budget allows; True if added.
        ``replace``: the entry in place is bad, so it goes even when the new one does not fit."""
        handles = self._h()
        size = len(data) + len(tail)
        temp = f"{name}.{os.getpid()}.{threading.get_ident()}.{next(_temp_names)}"
        _write_file(handles.tmp_fd, temp, data, tail)
        try:
            with (
                self._locked_ledger(handles) as ledger,
                in_shard(handles.entries_fd, name, self.root, create=True) as shard_fd,
            ):
                try:
                    old = os.stat(name, dir_fd=shard_fd, follow_symlinks=False).st_size
                except FileNotFoundError:
                    old = None
                used = ledger.used - (old or 0)
                if used + size > self.budget:
                    if replace and old is not None:
                        os.unlink(name, dir_fd=shard_fd)
                        ledger.entries -= 1
                    else:
                        used += old or 0
                    ledger.used = used
                    return False
                ledger.used = used + size
                ledger.entries += 0 if old is not None else 1
                # The ledger first: a kill between the two over-counts, never under.
                os.pwrite(handles.ledger_fd, ledger.pack(), 0)
                os.replace(temp, name, src_dir_fd=handles.tmp_fd, dst_dir_fd=shard_fd)
                return True
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(temp, dir_fd=handles.tmp_fd)

    def record_reads(self, hits: int, misses: int, bytes_served: int) -> None:
        if hits or misses:
            with self._locked_ledger(self._h()) as ledger:
                ledger.hits += hits
                ledger.misses += misses
                ledger.bytes_served += bytes_served


def remove_dead_temps(tmp_fd: int) -> None:
    """Remove the temporary files of writers that died (older than ``STALE_TEMP_S``)."""
    cutoff = time.time() - STALE_TEMP_S
    for name, mtime in list(temp_files(tmp_fd)):
        if mtime < cutoff:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(name, dir_fd=tmp_fd)


def _after_fork_in_child() -> None:
    for directory in list(_OPEN):
        directory._mutex = threading.Lock()
        directory._reopening = threading.Lock()
        for handles in [directory._handles, *directory._retired]:
            with contextlib.suppress(OSError):
                handles.close()
        directory._retired = []


os.register_at_fork(after_in_child=_after_fork_in_child)


def _lock_offset(name: str) -> int:
    return int(name[:8], 16)


def _write_file(dir_fd: int, name: str, data: bytes | bytearray, tail: bytes) -> None:
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(name, flags, 0o644, dir_fd=dir_fd)
    try:
        with open(fd, "wb") as file:  # writes all of each, or raises; closes fd
            file.write(data)
            file.write(tail)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name, dir_fd=dir_fd)
        raise
