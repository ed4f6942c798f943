"""ImageFolder's rules over a key table's bytes, with no ``str`` per key: which keys are
images in class folders, whether they are sorted, and each one's class.

Keys are compared as UTF-8 bytes, whose order is ``str``'s (code point) order: in chunks of
rows, one row per key, zero-padded to the longest key (a tie broken by length, as ``str``
does); a table whose rows would cost more than a few times its bytes takes the slow path."""

from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from .table import KeyTable

__all__ = ["image_folder"]

_ROWS_BYTES = 4 << 20  # the bytes of rows compared at once (temporaries the allocator reuses)


def key_spans(table: KeyTable) -> tuple[np.ndarray, np.ndarray]:
    """Where each key's bytes start and end in the table's blob."""
    offsets = table._segment.arrays["offsets"].astype(np.int64)
    starts, stops = offsets[:-1], offsets[1:]
    if not table._lines:
        return starts, stops
    blob = table._segment.arrays["blob"]
    breaks = np.flatnonzero(blob == 10)
    at = np.minimum(np.searchsorted(breaks, starts), max(len(breaks) - 1, 0))
    ends = np.minimum(breaks[at], stops) if len(breaks) else stops
    ends = np.where(ends < starts, stops, ends)
    carriage = (ends > starts) & (blob[np.maximum(ends - 1, 0)] == 13)
    return starts, ends - carriage


def _rows(blob: np.ndarray, starts: np.ndarray, lengths: np.ndarray, width: int) -> np.ndarray:
    """Keys as rows of ``width`` bytes, zero-padded: a copy of each key's window of the blob
    (the last few keys' from a padded copy of the blob's tail)."""
    tail_start = max(len(blob) - width, 0)
    tail = np.zeros(2 * width, dtype=np.uint8)
    tail[: len(blob) - tail_start] = blob[tail_start:]
    rows = np.empty((len(starts), width), dtype=np.uint8)
    inside = starts <= len(blob) - width
    if len(blob) >= width:
        rows[inside] = sliding_window_view(blob, width)[starts[inside]]
    windows = sliding_window_view(tail, width)
    rows[~inside] = windows[starts[~inside] - tail_start]
    rows *= np.arange(width) < lengths[:, None]
    return rows


def image_folder(
    table: KeyTable, extensions: tuple[str, ...]
) -> tuple[np.ndarray, np.ndarray, list[str]] | None:
    """The indices of the keys that are images in class folders (``"/"`` in the key, an
    extension of ``extensions`` in any case), each one's class index and the sorted classes;
    None when the table is not read so (the images are not sorted, an extension is not plain
    ASCII, or the keys' lengths vary too much): the caller then takes the slow path."""
    # KELVIN SIGN lowers to k: an extension with a k is left to the slow path
    if not extensions or not all(e.isascii() and "k" not in e for e in extensions):
        return None
    blob = table._segment.arrays["blob"]
    starts, ends = key_spans(table)
    lengths = ends - starts
    width = int(lengths.max()) + 1 if len(lengths) else 1  # +1: a key has a 0 after it
    if len(starts) * width > 4 * len(blob) + (1 << 20):
        return None
    suffixes = {e.lower().encode() for e in extensions}
    if max(map(len, suffixes)) > 8:
        return None
    by_size: dict[int, np.ndarray] = {}
    for suffix in suffixes:
        same_size = [int.from_bytes(suffix, "big"), *by_size.get(len(suffix), [])]
        by_size[len(suffix)] = np.array(same_size, dtype=np.uint64)
    chunk = max(2, _ROWS_BYTES // width)
    # every 8 bytes of the blob, by where they start (a tiny blob's keys are all read below)
    eights = sliding_window_view(blob, 8) if len(blob) >= 8 else np.zeros((1, 8), np.uint8)
    image = np.zeros(len(starts), bool)
    folder_lengths = np.zeros(len(starts), np.int64)
    differ = np.zeros(max(len(starts) - 1, 0), bool)  # pair (i, i + 1): another folder
    for first in range(0, len(starts), chunk - 1):
        span = slice(first, min(first + chunk, len(starts)))
        rows = _rows(blob, starts[span], lengths[span], width)
        slash = rows == ord("/")
        folder_lengths[span] = np.where(slash.any(axis=1), slash.argmax(axis=1), -1)
        # The last 8 bytes of each key (zeros before a shorter one), lowered (ASCII), as a
        # big-endian integer: an extension of n bytes is its low n bytes.
        at = np.arange(len(rows))
        last = eights[np.maximum(ends[span] - 8, 0)]
        for row in np.flatnonzero(ends[span] < 8):  # a key ending in the blob's first 8 bytes
            last[row] = np.frombuffer(bytes(blob[: ends[span][row]]).rjust(8, b"\0"), np.uint8)
        last |= ((last >= 65) & (last <= 90)).view(np.uint8) << 5
        tail = last.view(">u8")[:, 0]
        found = np.zeros(len(rows), bool)
        for size, wanted in by_size.items():  # the bytes before a key are not its own
            mine = lengths[span] >= size
            found |= mine & np.isin(tail & np.uint64((1 << 8 * size) - 1), wanted)
        image[span] = found & (folder_lengths[span] >= 0)
        # Adjacent keys of the chunk: where they first differ decides their order and folder.
        unequal = rows[1:] != rows[:-1]
        differs = unequal.any(axis=1)
        position = unequal.argmax(axis=1)
        a, b = rows[at[:-1], position], rows[at[1:], position]
        shorter = lengths[span][:-1] > lengths[span][1:]
        if np.any(np.where(differs, a > b, shorter)):  # the whole table must be sorted
            return None
        mine = folder_lengths[span][:-1]
        differ[first : first + len(rows) - 1] = (mine != folder_lengths[span][1:]) | (
            differs & (position < mine)
        )
    return _classes(table, image, differ, starts, folder_lengths)


def _classes(
    table: KeyTable,
    image: np.ndarray,
    differ: np.ndarray,
    starts: np.ndarray,
    folder_lengths: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, list[str]] | None:
    """The images' indices, class indices and classes, given where the folder changes
    between adjacent keys (images or not)."""
    picks = np.flatnonzero(image)
    if len(picks) == 0:
        return picks, picks, []
    blob = table._segment.arrays["blob"]
    group = np.concatenate(([0], np.cumsum(differ)))[picks]
    firsts = picks[np.flatnonzero(np.concatenate(([True], group[1:] != group[:-1])))]
    names = [
        bytes(blob[starts[i] : starts[i] + folder_lengths[i]]).decode("utf-8", "surrogatepass")
        for i in firsts.tolist()
    ]
    if len(set(names)) != len(names):  # a folder's images apart: not sorted
        return None
    classes = sorted(names)
    rank = {name: i for i, name in enumerate(classes)}
    labels = np.array([rank[n] for n in names], dtype=np.int64)
    return picks, labels[np.cumsum(np.concatenate(([0], group[1:] != group[:-1])))], classes
