"""Segments: read-only files of named numpy arrays, mapped by every process that uses them,
and their lifetime (see :mod:`concurrent_loader.keys`)."""

from __future__ import annotations

import contextlib
import json
import mmap
import os
import secrets
import shutil
import tempfile
import threading
import weakref
from collections.abc import Mapping
from typing import Any

import numpy as np

__all__ = ["MAGIC", "Segment", "arrays_of", "attach", "remove_stale_segments"]

#: The first bytes of a segment (and a binary manifest): not UTF-8, so no text manifest starts so.
MAGIC = b"\x93CLKEYS1"
PREFIX = "concurrent_loader-keys-"
_ALIGN = 64


def _start_time(pid: int) -> str | None:
    """The start time of process ``pid`` (clock ticks since boot), None when it is not running."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except FileNotFoundError:
        return None
    except OSError:  # no /proc: a pid that answers a signal is taken as alive
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except PermissionError:
            pass
        return "0"
    return stat.rsplit(b")", 1)[1].split()[19].decode()


def _pid_namespace() -> str:
    """This process's pid namespace: pids of another mean nothing here."""
    try:
        return os.readlink("/proc/self/ns/pid").strip("pid:[]")
    except OSError:
        return "0"


def _proc_is_ours() -> bool:
    """Whether ``/proc`` shows this process's pid namespace (``unshare -p`` without a new
    ``/proc`` shows another: its pids, and their start times, are not ours to judge)."""
    try:
        return int(os.readlink("/proc/self")) == os.getpid()
    except (OSError, ValueError):
        return False


def _directories() -> list[str]:
    return [d for d in ("/dev/shm", tempfile.gettempdir()) if os.path.isdir(d)]


def remove_stale_segments() -> int:
    """Remove the segments whose creator is no longer running; their number."""
    removed = 0
    if not _proc_is_ours():  # no creator can be told dead: leave every file
        return removed
    namespace = _pid_namespace()
    for directory in _directories():
        try:
            names = os.listdir(directory)
        except OSError:
            continue
        for name in names:
            if not name.startswith(PREFIX):
                continue
            try:
                space, pid, started = name[len(PREFIX) :].split("-")[:3]
                # "0": a creator that could not read its start time, never judged dead
                alive = (
                    space != namespace or started == "0" or _start_time(int(pid)) in (started, "0")
                )
            except ValueError:
                continue
            if not alive:
                try:
                    os.unlink(os.path.join(directory, name))
                    removed += 1
                except OSError:  # gone already, or another user's (sticky directory)
                    pass
    return removed


def _new_segment_file(size: int) -> tuple[str, int]:
    """A new segment file of ``size`` bytes, allocated (a page of a mapped file that the
    filesystem cannot store would kill the process with SIGBUS when written): its path and an
    open descriptor. ``/dev/shm`` first, where it has room (Docker's default is 64 MiB), else
    the temporary directory (pages of a file the kernel may write back when memory is short)."""
    remove_stale_segments()
    pid = os.getpid()
    started = (_start_time(pid) if _proc_is_ours() else None) or "0"
    name = f"{PREFIX}{_pid_namespace()}-{pid}-{started}-{secrets.token_hex(6)}"
    candidates = [d for d in _directories() if shutil.disk_usage(d).free >= size + (64 << 20)]
    for directory in candidates or [tempfile.gettempdir()]:
        path = os.path.join(directory, name)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.posix_fallocate(fd, 0, max(size, 1))
            return path, fd
        except OSError as exc:
            os.close(fd)
            os.unlink(path)
            failure = exc
    raise OSError(failure.errno, f"no room for a key table of {size} bytes: {failure.strerror}")


def _layout(
    arrays: Mapping[str, tuple[np.dtype[Any], int]], meta: Mapping[str, Any]
) -> tuple[bytes, dict[str, int]]:
    """The header and each array's offset in the file."""
    placed: dict[str, list[Any]] = {}
    room = 0  # bytes before the first array: grows until the header (which names it) fits
    while True:
        at = -(-(len(MAGIC) + 8 + room) // _ALIGN) * _ALIGN
        for name, (dtype, count) in arrays.items():
            placed[name] = [dtype.str, at, count]
            at += -(-(dtype.itemsize * count) // _ALIGN) * _ALIGN
        header = json.dumps({"arrays": placed, "size": at, "meta": dict(meta)}).encode()
        if len(header) <= room:
            return header, {name: spec[1] for name, spec in placed.items()}
        room = len(header)


class Segment:
    """One mapped segment file; the creator's copy unlinks the file when released."""

    def __init__(
        self,
        path: str,
        mapped: mmap.mmap,
        layout: tuple[dict[str, np.ndarray], dict[str, Any]],
        creator: int | None,
    ) -> None:
        self.path = path
        self.mapped = mapped
        self.arrays, self.meta = layout
        self.creator = creator
        self.users = 0
        self.lock = threading.Lock()
        # A forked child inherits this object: the pid check keeps it from unlinking the file.
        self.unlink = weakref.finalize(self, _unlink_if_creator, path, creator)

    @classmethod
    def create(
        cls, arrays: Mapping[str, tuple[np.dtype[Any], int]], meta: Mapping[str, Any]
    ) -> Segment:
        """A new segment of ``arrays`` (dtype, length), zeroed, and ``meta`` (JSON) beside."""
        header, offsets = _layout(arrays, meta)
        size = json.loads(header)["size"]
        path, fd = _new_segment_file(size)
        try:
            mapped = mmap.mmap(fd, max(size, 1))
        except BaseException:
            os.unlink(path)
            raise
        finally:
            os.close(fd)
        mapped[: len(MAGIC) + 8 + len(header)] = MAGIC + len(header).to_bytes(8, "little") + header
        views = {
            name: np.frombuffer(mapped, dtype=dtype, count=count, offset=offsets[name])
            for name, (dtype, count) in arrays.items()
        }
        segment = cls(path, mapped, (views, dict(meta)), os.getpid())
        with attached_lock:
            attached[path] = segment  # unpickled in this process: the same pages
        return segment

    def published(self) -> str:
        """The path other processes map; a segment this process made and has since released
        is written again under a new name (the table stays usable after ``close()``)."""
        with self.lock:
            if self.creator != os.getpid() or self.unlink.alive:
                return self.path
            path, fd = _new_segment_file(len(self.mapped))
            with open(fd, "wb") as f:
                f.write(self.mapped)
            self.path = path
            self.unlink = weakref.finalize(self, _unlink_if_creator, path, os.getpid())
            with attached_lock:
                attached[path] = self
            return path

    @classmethod
    def attach(cls, path: str) -> Segment:
        try:
            with open(path, "rb") as f:
                mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except FileNotFoundError:
            raise FileNotFoundError(
                f"the key table {path} is gone: the dataset that made it was closed, or its "
                "process ended"
            ) from None
        return cls(path, mapped, arrays_of(mapped, path), None)


def arrays_of(data: Any, name: str) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """The arrays (views of ``data``) and the meta of a segment's bytes."""
    view = memoryview(data)
    if bytes(view[: len(MAGIC)]) != MAGIC:
        raise ValueError(f"{name} is not a key table (no {MAGIC!r} at its start)")
    length = int.from_bytes(view[len(MAGIC) : len(MAGIC) + 8], "little")
    try:
        header = json.loads(bytes(view[len(MAGIC) + 8 : len(MAGIC) + 8 + length]))
        if header["size"] > len(view):
            raise ValueError(f"{len(view)} bytes, the header says {header['size']}")
        arrays = {
            key: np.frombuffer(data, dtype=np.dtype(dtype), count=count, offset=at)
            for key, (dtype, at, count) in header["arrays"].items()
        }
        return arrays, dict(header["meta"])
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{name} is not a readable key table: {exc}") from exc


def _unlink_if_creator(path: str, creator: int | None) -> None:
    if os.getpid() == creator:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


#: Every segment this process maps, by path (a table unpickled twice maps it once).
attached: weakref.WeakValueDictionary[str, Segment] = weakref.WeakValueDictionary()
attached_lock = threading.Lock()


def attach(path: str) -> Segment:
    """The segment at ``path``, mapped once per process."""
    with attached_lock:
        segment = attached.get(path)
        if segment is None:
            segment = attached[path] = Segment.attach(path)
        return segment
