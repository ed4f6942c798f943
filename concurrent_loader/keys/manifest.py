"""Text manifests: which keys a line can hold, and the keys of a manifest's bytes."""

from __future__ import annotations

import numpy as np

from .table import KeyTable

__all__ = ["parse_manifest_text", "refused_key"]


def refused_key(key: str) -> str | None:
    """Why ``key`` cannot be a line of a manifest (it would not read back as itself), or None."""
    if "\n" in key or "\r" in key or not key.strip() or key.startswith("#"):
        return "it has a line break, is blank, or starts with '#'"
    return None


def parse_manifest_text(data: bytes) -> KeyTable:
    """The keys of a text manifest's bytes: lines split on ``\\n`` only, a trailing ``\\r``
    dropped, blank and ``#`` lines skipped; no Python object per key."""
    if not data:
        return KeyTable.build(0, 0)
    raw = np.frombuffer(data, dtype=np.uint8)
    if np.any(raw >= 128):
        data.decode("utf-8")  # a manifest is UTF-8: UnicodeDecodeError names the first bad byte
    breaks = np.flatnonzero(raw == 10)
    starts = np.concatenate(([0], breaks + 1))
    ends = np.concatenate((breaks, [len(raw)]))
    carriage = (ends > starts) & (raw[np.maximum(ends - 1, 0)] == 13)
    ends = ends - carriage
    keep = ends > starts
    firsts = raw[np.minimum(starts, len(raw) - 1)]
    keep &= firsts != ord("#")
    # Lines that may be all whitespace (they start with ASCII whitespace or a non-ASCII byte)
    # are few: str.strip decides those.
    doubtful = np.flatnonzero(keep & ((firsts <= 32) | (firsts >= 128)))
    for i in doubtful.tolist():
        keep[i] = bool(data[starts[i] : ends[i]].decode().strip())
    # The text is the blob, as it is: key i spans from its line's start to the next key's,
    # and ends at its first line break (skipped lines and line breaks cost a byte or two).
    kept = starts[keep]
    table = KeyTable.build(len(kept), len(raw), lines=True)
    offsets = table._segment.arrays["offsets"]
    offsets[:-1] = kept
    offsets[-1] = len(raw)
    table._segment.arrays["blob"][:] = raw
    return table
