"""The key table: keys as offsets + one UTF-8 blob, and integer columns, in one segment."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, BinaryIO, overload

import numpy as np

from .segment import Segment, arrays_of, attach

__all__ = ["KeyTable", "gather"]

_KEYS = ("offsets", "blob")  # the arrays that hold the keys; any other is a column


def _attach(path: str) -> KeyTable:
    return KeyTable._of(attach(path))


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
        cls,
        count: int,
        blob_size: int,
        columns: Mapping[str, Any] | None = None,
        *,
        lines: bool = False,
    ) -> KeyTable:
        """An empty table for ``count`` keys in ``blob_size`` bytes: the caller fills
        ``arrays["blob"]`` and ``arrays["offsets"]`` (``count + 1``, non-decreasing: key ``i``
        is ``blob[offsets[i]:offsets[i + 1]]``). With ``lines``, key ``i`` ends at the first
        ``\\n`` there, a ``\\r`` before it dropped (a text manifest's bytes, kept as they are)."""
        offsets = np.dtype(np.uint32 if blob_size < 2**32 else np.uint64)
        spec = {"offsets": (offsets, count + 1), "blob": (np.dtype(np.uint8), blob_size)}
        values = {name: np.asarray(column) for name, column in (columns or {}).items()}
        for name, value in values.items():
            if len(value) != count or value.dtype.kind not in "iu":
                raise ValueError(f"column {name!r}: {count} integers needed, got {value.dtype}")
            spec[name] = (_narrowest(value), count)
        segment = Segment.create(spec, {"lines": lines})
        for name, value in values.items():
            segment.arrays[name][:] = value
        return cls._of(segment)

    @classmethod
    def _of(cls, segment: Segment) -> KeyTable:
        table = cls.__new__(cls)
        table._set(segment)
        return table

    def _set(self, segment: Segment) -> None:
        self._segment = segment
        # memoryviews: indexing gives an int, slicing a view, with no numpy scalar on the way
        self._offsets = memoryview(segment.arrays["offsets"].data)
        self._blob = memoryview(segment.arrays["blob"].data)
        self._lines = bool(segment.meta.get("lines"))

    @classmethod
    def load(cls, data: bytes | memoryview | str | os.PathLike[str]) -> KeyTable:
        """A table from a binary manifest: its bytes, or a local file's path (copied)."""
        if isinstance(data, (str, os.PathLike)):
            with open(data, "rb") as f:
                data = f.read()
        arrays, meta = arrays_of(data, "the manifest")
        columns = {k: v for k, v in arrays.items() if k not in _KEYS}
        ends, blob = arrays["offsets"].astype(np.int64), arrays["blob"]
        if len(ends) == 0 or ends[0] < 0 or ends[-1] > len(blob) or np.any(np.diff(ends) < 0):
            raise ValueError("the manifest's key offsets do not tile its keys")
        table = cls.build(len(ends) - 1, len(blob), columns, lines=bool(meta.get("lines")))
        table._segment.arrays["offsets"][:] = ends
        table._segment.arrays["blob"][:] = blob
        return table

    def subset(self, picks: np.ndarray, columns: Mapping[str, Any] | None = None) -> KeyTable:
        """A new table of keys ``picks`` (ascending indices) with this table's columns at
        those indices and ``columns`` (of ``len(picks)``) beside them."""
        if np.any(np.diff(picks) <= 0):  # gather copies spans in the blob's order
            raise ValueError("subset needs strictly ascending picks")
        ends = self._segment.arrays["offsets"].astype(np.int64)
        starts, stops = ends[:-1][picks], ends[1:][picks]
        mine = {k: v[picks] for k, v in self._segment.arrays.items() if k not in _KEYS}
        size, every = int((stops - starts).sum()), {**mine, **(columns or {})}
        table = KeyTable.build(len(picks), size, every, lines=self._lines)
        np.cumsum(stops - starts, out=table._segment.arrays["offsets"][1:], dtype=ends.dtype)
        gather(self._segment.arrays["blob"], starts, stops, table._segment.arrays["blob"])
        return table

    def save(self, file: BinaryIO | str | os.PathLike[str]) -> None:
        """Write the table as a binary manifest (``load`` reads it back)."""
        if isinstance(file, (str, os.PathLike)):
            with open(file, "wb") as f:
                f.write(self._segment.mapped)
        else:
            file.write(self._segment.mapped)

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
        key = str(
            self._blob[self._offsets[index] : self._offsets[index + 1]], "utf-8", "surrogatepass"
        )
        return key.partition("\n")[0].removesuffix("\r") if self._lines else key

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


def gather(source: np.ndarray, starts: np.ndarray, stops: np.ndarray, out: np.ndarray) -> None:
    """``source[starts[0]:stops[0]] + source[starts[1]:stops[1]] + ...`` into ``out``, for
    ascending, non-overlapping spans: a copy per run of adjacent spans, or, when runs are
    many, one byte mask (no index per byte)."""
    if len(starts) == 0:
        return
    breaks = np.flatnonzero(starts[1:] != stops[:-1]) + 1
    if len(breaks) < 4096:  # few runs (a whole manifest, a class left out): plain copies
        at = 0
        firsts, lasts = [0, *breaks.tolist()], [*(breaks - 1).tolist(), len(starts) - 1]
        for first, last in zip(firsts, lasts, strict=True):
            length = int(stops[last] - starts[first])
            out[at : at + length] = source[starts[first] : stops[last]]
            at += length
        return
    inside = np.zeros(len(source) + 1, dtype=np.int8)
    np.add.at(inside, starts, 1)  # add.at: one span may stop where the next starts
    np.add.at(inside, stops, -1)
    np.cumsum(inside, out=inside)
    np.compress(inside[:-1].view(bool), source, out=out)
