"""One cache entry on disk: the object's bytes, then what they are, then a checksum.

Layout (little-endian)::

    data | etag (UTF-8) | source (UTF-8) | data length u64 | etag length u16 |
    source length u16 | crc32 u32 | b"CLC1"

``source`` names the object; ``crc32`` covers data, ETag and source. An entry is read whole
into the buffer that becomes the body. A file truncated, with any byte flipped, or of
another object is refused with :class:`CorruptEntry`, never served.
"""

from __future__ import annotations

import os
import stat
import struct
import zlib
from dataclasses import dataclass

__all__ = ["CorruptEntry", "Entry", "TooLarge", "data_checksum", "footer", "read_entry_fd"]

MAGIC = b"CLC1"
_TAIL = struct.Struct("<QHHI4s")
#: the largest ETag or source we store (longer ones are not cached)
MAX_FIELD = 0xFFFF


class CorruptEntry(Exception):
    """The file is not a whole, intact entry for the object asked for."""


@dataclass(slots=True)
class Entry:
    """An intact entry: the object's bytes and the ETag the store gave with them."""

    data: bytearray
    etag: str | None


def data_checksum(data: bytes | bytearray | memoryview) -> int:
    """The checksum of an object's bytes, taken before anyone else holds them."""
    return zlib.crc32(data)


def footer(data_len: int, data_crc: int, etag: str | None, source: str) -> bytes:
    etag_bytes = (etag or "").encode()
    source_bytes = source.encode()
    if len(etag_bytes) > MAX_FIELD or len(source_bytes) > MAX_FIELD:
        raise ValueError("an ETag or object name too long to cache")
    meta = etag_bytes + source_bytes
    crc = zlib.crc32(meta, data_crc)
    return meta + _TAIL.pack(data_len, len(etag_bytes), len(source_bytes), crc, MAGIC)


class TooLarge(Exception):
    """The entry is larger than the caller reads in place (it reads it elsewhere)."""


def read_entry_fd(fd: int, path: str, source: str, max_bytes: int | None = None) -> Entry:
    """The entry open at ``fd`` (``path`` in messages) for ``source``: ``CorruptEntry`` if
    it does not check out, ``TooLarge`` (having read nothing) if over ``max_bytes``."""
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        raise CorruptEntry(f"{path}: not a regular file")
    size = st.st_size
    if max_bytes is not None and size > max_bytes:
        raise TooLarge(path)
    buf = bytearray(size)
    got = 0
    with memoryview(buf) as view:
        while got < size:
            n = os.readv(fd, [view[got:]])
            if not n:
                break
            got += n
    if got != size or size < _TAIL.size:
        raise CorruptEntry(f"{path}: {got} of {size} bytes, shorter than an entry")
    data_len, etag_len, source_len, crc, magic = _TAIL.unpack_from(buf, size - _TAIL.size)
    if magic != MAGIC or data_len + etag_len + source_len + _TAIL.size != size:
        raise CorruptEntry(f"{path}: not a whole entry")
    meta_end = size - _TAIL.size
    with memoryview(buf) as view:
        if view[data_len + etag_len : meta_end] != source.encode():
            raise CorruptEntry(f"{path}: an entry for another object")
        if zlib.crc32(view[data_len:meta_end], zlib.crc32(view[:data_len])) != crc:
            raise CorruptEntry(f"{path}: checksum mismatch")
        etag = bytes(view[data_len : data_len + etag_len]).decode() if etag_len else None
    del buf[data_len:]
    return Entry(buf, etag)
