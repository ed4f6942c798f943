"""Object keys stored once per node: a read-only memory-mapped file every process maps.

A :class:`KeyTable` holds its keys as one UTF-8 blob plus an offsets array, and beside them
optional integer columns (object sizes, class indices), all in one file (a *segment*) under
``/dev/shm`` (or the temporary directory when that has no room). Forked workers share its
pages (no Python object per key, so no page is copied by reference counting, PyTorch issue
#13246); ``spawn`` and ``forkserver`` workers receive only the segment's path when the table
is pickled and map the same pages. A key becomes a ``str`` only when it is read.

Lifetime. A segment's name carries its creator's pid namespace, pid and start time. The
creator unlinks it when the last dataset using the table releases it (:meth:`KeyTable.acquire`,
:meth:`KeyTable.release`), when the table is garbage collected, or at interpreter exit;
processes that mapped it keep their pages until they unmap them (the kernel frees them then).
A creator killed before any of these leaves its file behind: every new segment first removes
those of creators that are no longer alive (a live creator's, or one in another pid namespace
sharing ``/dev/shm``, are never touched).

The segment's file is also the binary manifest (:meth:`KeyTable.save`, :meth:`KeyTable.load`).
"""

from __future__ import annotations

import json
import mmap
import os
import secrets
import shutil
import tempfile
import threading
import weakref
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, overload

import numpy as np

__all__ = ["MAGIC", "KeyTable", "parse_manifest_text", "refused_key"]

#: The first bytes of a segment (and a binary manifest): not UTF-8, so no text manifest starts so.
MAGIC = b"\x93CLKEYS1"
PREFIX = "concurrent_loader-keys-"
_ALIGN = 64


def refused_key(key: str) -> str | None:
    """Why ``key`` cannot be a line of a manifest (it would not read back as itself), or None."""
    if "\n" in key or "\r" in key or not key.strip() or key.startswith("#"):
        return "it has a line break, is blank, or starts with '#'"
    return None


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


def _directories() -> list[str]:
    return [d for d in ("/dev/shm", tempfile.gettempdir()) if os.path.isdir(d)]


def remove_stale_segments() -> int:
    """Remove the segments whose creator is no longer running; their number."""
    removed = 0
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
                alive = space != namespace or _start_time(int(pid)) in (started, "0")
            except ValueError:
                continue
            if not alive:
                try:
                    os.unlink(os.path.join(directory, name))
                    removed += 1
                except FileNotFoundError:
                    pass
    return removed


def _new_segment_path(size: int) -> str:
    remove_stale_segments()
    pid = os.getpid()
    name = f"{PREFIX}{_pid_namespace()}-{pid}-{_start_time(pid)}-{secrets.token_hex(6)}"
    for directory in _directories():
        free = shutil.disk_usage(directory).free
        if free >= 2 * size + (64 << 20):
            return os.path.join(directory, name)
    return os.path.join(tempfile.gettempdir(), name)


def _layout(arrays: Mapping[str, tuple[np.dtype[Any], int]]) -> tuple[bytes, dict[str, int]]:
    """The header and each array's offset in the file."""
    placed: dict[str, list[Any]] = {}
    header = b""
    for _ in range(2):  # the header's length moves the arrays; its digits settle on the 2nd pass
        at = -(-(len(MAGIC) + 8 + len(header)) // _ALIGN) * _ALIGN
        for name, (dtype, count) in arrays.items():
            placed[name] = [dtype.str, at, count]
            at += -(-(dtype.itemsize * count) // _ALIGN) * _ALIGN
        header = json.dumps({"arrays": placed, "size": at}).encode()
    return header, {name: spec[1] for name, spec in placed.items()}


class _Segment:
    """One mapped segment file; the creator's copy unlinks the file when released."""

    def __init__(
        self, path: str, mapped: mmap.mmap, arrays: dict[str, np.ndarray], creator: int | None
    ) -> None:
        self.path = path
        self.mapped = mapped
        self.arrays = arrays
        self.creator = creator
        self.users = 0
        self.lock = threading.Lock()
        # A forked child inherits this object: the pid check keeps it from unlinking the file.
        self.unlink = weakref.finalize(self, _unlink_if_creator, path, creator)

    @classmethod
    def create(cls, arrays: Mapping[str, tuple[np.dtype[Any], int]]) -> _Segment:
        header, offsets = _layout(arrays)
        size = json.loads(header)["size"]
        path = _new_segment_path(size)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.ftruncate(fd, max(size, 1))
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
        segment = cls(path, mapped, views, os.getpid())
        with _attached_lock:
            _attached[path] = segment  # unpickled in this process: the same pages
        return segment

    def published(self) -> str:
        """The path other processes map; a segment this process made and has since released
        is written again under a new name (the table stays usable after ``close()``)."""
        with self.lock:
            if self.creator != os.getpid() or self.unlink.alive:
                return self.path
            path = _new_segment_path(len(self.mapped))
            with open(path, "xb") as f:
                f.write(self.mapped)
            self.path = path
            self.unlink = weakref.finalize(self, _unlink_if_creator, path, os.getpid())
            with _attached_lock:
                _attached[path] = self
            return path

    @classmethod
    def attach(cls, path: str) -> _Segment:
        try:
            with open(path, "rb") as f:
                mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except FileNotFoundError:
            raise FileNotFoundError(
                f"the key table {path} is gone: the dataset that made it was closed, or its "
                "process ended"
            ) from None
        return cls(path, mapped, _arrays_of(mapped, path), None)


def _arrays_of(data: Any, name: str) -> dict[str, np.ndarray]:
    view = memoryview(data)
    if bytes(view[: len(MAGIC)]) != MAGIC:
        raise ValueError(f"{name} is not a key table (no {MAGIC!r} at its start)")
    length = int.from_bytes(view[len(MAGIC) : len(MAGIC) + 8], "little")
    try:
        header = json.loads(bytes(view[len(MAGIC) + 8 : len(MAGIC) + 8 + length]))
        if header["size"] > len(view):
            raise ValueError(f"{len(view)} bytes, the header says {header['size']}")
        return {
            key: np.frombuffer(data, dtype=np.dtype(dtype), count=count, offset=at)
            for key, (dtype, at, count) in header["arrays"].items()
        }
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{name} is not a readable key table: {exc}") from exc


def _unlink_if_creator(path: str, creator: int | None) -> None:
    if os.getpid() == creator:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


_attached: weakref.WeakValueDictionary[str, _Segment] = weakref.WeakValueDictionary()
_attached_lock = threading.Lock()


def _attach(path: str) -> KeyTable:
    with _attached_lock:
        segment = _attached.get(path)
        if segment is None:
            segment = _attached[path] = _Segment.attach(path)
    return KeyTable._of(segment)


class KeyTable(Sequence[str]):
    """Keys (and integer ``columns`` of the same length: ``sizes``, ``targets``) in a segment."""

    def __init__(
        self, keys: Iterable[str], columns: Mapping[str, np.ndarray | Sequence[int]] | None = None
    ) -> None:
        # surrogatepass: a tar member name that is not UTF-8 (read as tarfile reads it, with
        # surrogateescape) is a key too, and comes back as it went in.
        encoded = [key.encode("utf-8", "surrogatepass") for key in keys]
        ends = np.cumsum(np.fromiter(map(len, encoded), dtype=np.int64, count=len(encoded)))
        table = KeyTable.build(len(encoded), int(ends[-1]) if len(ends) else 0, columns)
        table._segment.arrays["offsets"][1:] = ends
        table._segment.arrays["blob"][:] = np.frombuffer(b"".join(encoded), dtype=np.uint8)
        self._set(table._segment)

    @classmethod
    def build(
        cls, count: int, blob_size: int, columns: Mapping[str, Any] | None = None
    ) -> KeyTable:
        """An empty table for ``count`` keys of ``blob_size`` bytes: the caller fills
        ``arrays["offsets"]`` (``count + 1`` ends, the first 0) and ``arrays["blob"]``."""
        offsets = np.dtype(np.uint32 if blob_size < 2**32 else np.uint64)
        spec = {"offsets": (offsets, count + 1), "blob": (np.dtype(np.uint8), blob_size)}
        values = {name: np.asarray(column) for name, column in (columns or {}).items()}
        for name, value in values.items():
            if len(value) != count or value.dtype.kind not in "iu":
                raise ValueError(f"column {name!r}: {count} integers needed, got {value.dtype}")
            spec[name] = (_narrowest(value), count)
        segment = _Segment.create(spec)
        for name, value in values.items():
            segment.arrays[name][:] = value
        return cls._of(segment)

    @classmethod
    def _of(cls, segment: _Segment) -> KeyTable:
        table = cls.__new__(cls)
        table._set(segment)
        return table

    def _set(self, segment: _Segment) -> None:
        self._segment = segment
        self._offsets = memoryview(segment.arrays["offsets"])  # int per index, no numpy scalar
        self._blob = memoryview(segment.arrays["blob"])

    @classmethod
    def load(cls, data: bytes | memoryview | str | os.PathLike[str]) -> KeyTable:
        """A table from a binary manifest: its bytes, or a local file's path (copied)."""
        if isinstance(data, (str, os.PathLike)):
            with open(data, "rb") as f:
                data = f.read()
        arrays = _arrays_of(data, "the manifest")
        columns = {k: v for k, v in arrays.items() if k not in ("offsets", "blob")}
        ends, blob = arrays["offsets"].astype(np.int64), arrays["blob"]
        if len(ends) == 0 or ends[0] != 0 or ends[-1] != len(blob) or np.any(np.diff(ends) < 0):
            raise ValueError("the manifest's key offsets do not tile its keys")
        table = cls.build(len(ends) - 1, len(blob), columns)
        table._segment.arrays["offsets"][:] = ends
        table._segment.arrays["blob"][:] = blob
        return table

    def subset(self, picks: np.ndarray, columns: Mapping[str, Any] | None = None) -> KeyTable:
        """A new table of keys ``picks`` (ascending indices) with this table's columns at
        those indices and ``columns`` (of ``len(picks)``) beside them."""
        ends = self._segment.arrays["offsets"].astype(np.int64)
        starts, stops = ends[:-1][picks], ends[1:][picks]
        mine = {k: v[picks] for k, v in self._segment.arrays.items() if k not in ("offsets", "blob")}
        table = KeyTable.build(len(picks), int((stops - starts).sum()), {**mine, **(columns or {})})
        np.cumsum(stops - starts, out=table._segment.arrays["offsets"][1:], dtype=ends.dtype)
        _gather(self._segment.arrays["blob"], starts, stops, table._segment.arrays["blob"])
        return table

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the table as a binary manifest (``load`` reads it back)."""
        with open(path, "wb") as f:
            f.write(self._segment.mapped)

    @property
    def path(self) -> str:
        return self._segment.path

    def column(self, name: str) -> np.ndarray | None:
        """Column ``name`` (read-only in a process that did not make the table), or None."""
        return self._segment.arrays.get(name)

    def acquire(self) -> KeyTable:
        """Count one more user; the segment is unlinked when the last one :meth:`release`\\ s."""
        with self._segment.lock:
            self._segment.users += 1
        return self

    def release(self) -> None:
        with self._segment.lock:
            self._segment.users -= 1
            if self._segment.users > 0:
                return
        self._segment.unlink()

    def __len__(self) -> int:
        return len(self._offsets) - 1

    @overload
    def __getitem__(self, index: int) -> str: ...
    @overload
    def __getitem__(self, index: slice) -> list[str]: ...
    def __getitem__(self, index: int | slice) -> str | list[str]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        n = len(self)
        if index < 0:
            index += n
        if not 0 <= index < n:
            raise IndexError(f"key index {index} out of range for {n} keys")
        return str(self._blob[self._offsets[index] : self._offsets[index + 1]], "utf-8", "surrogatepass")

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return _attach, (self._segment.published(),)

    def __repr__(self) -> str:
        return f"KeyTable({len(self)} keys)"


def _narrowest(values: np.ndarray) -> np.dtype[Any]:
    if len(values) == 0:
        return np.dtype(np.int64)
    low, high = int(values.min()), int(values.max())
    for dtype in (np.int8, np.int16, np.int32):
        if np.iinfo(dtype).min <= low and high <= np.iinfo(dtype).max:
            return np.dtype(dtype)
    return np.dtype(np.int64)


def parse_manifest_text(data: bytes) -> KeyTable:
    """The keys of a text manifest's bytes: lines split on ``\\n`` only, a trailing ``\\r``
    dropped, blank and ``#`` lines skipped; no Python object per key."""
    raw = np.frombuffer(data, dtype=np.uint8)
    if np.any(raw >= 128):
        data.decode("utf-8")  # a manifest is UTF-8: UnicodeDecodeError names the first bad byte
    breaks = np.flatnonzero(raw == 10)
    starts = np.concatenate(([0], breaks + 1))
    ends = np.concatenate((breaks, [len(raw)]))
    carriage = (ends > starts) & (raw[np.maximum(ends - 1, 0)] == 13)
    ends = ends - carriage
    keep = ends > starts
    firsts = raw[np.minimum(starts, max(len(raw) - 1, 0))] if len(raw) else np.zeros(0, np.uint8)
    keep &= firsts != ord("#")
    # Lines that may be all whitespace (they start with ASCII whitespace or a non-ASCII byte)
    # are few: str.strip decides those.
    doubtful = np.flatnonzero(keep & ((firsts <= 32) | (firsts >= 128)))
    for i in doubtful.tolist():
        keep[i] = bool(data[starts[i] : ends[i]].decode().strip())
    starts, ends = starts[keep], ends[keep]
    lengths = ends - starts
    table = KeyTable.build(len(starts), int(lengths.sum()))
    offsets = table._segment.arrays["offsets"]
    np.cumsum(lengths, out=offsets[1:], dtype=offsets.dtype)
    _gather(raw, starts, ends, table._segment.arrays["blob"])
    return table


def _gather(source: np.ndarray, starts: np.ndarray, stops: np.ndarray, out: np.ndarray) -> None:
    """``source[starts[0]:stops[0]] + source[starts[1]:stops[1]] + ...`` into ``out``, for
    ascending, non-overlapping, non-empty spans: one byte mask, no index per byte."""
    inside = np.zeros(len(source) + 1, dtype=np.int8)
    np.add.at(inside, starts, 1)  # add.at: one span may stop where the next starts
    np.add.at(inside, stops, -1)
    np.cumsum(inside, out=inside)
    np.compress(inside[:-1].view(bool), source, out=out)
