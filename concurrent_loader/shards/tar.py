"""Tar archives as bytes: headers, members, and WebDataset's grouping of members into samples.

Headers (ustar, pax ``x``/``g``, GNU ``L``/``K``) are read as Python's ``tarfile`` reads
them, so the members are those ``webdataset`` sees. A walk is linear in the bytes walked,
and every malformed header is a ``ShardError`` naming the shard and offset, never another
exception. Grouping is ``webdataset``'s (``tariterators.py``): regular files only, metadata
names skipped, key and extension split at the first dot of the last path component
(extension lower-cased), consecutive members with one key one sample; a repeated
extension, or ``__key__`` or ``__url__``, is an error.
"""

from __future__ import annotations

import functools
import re
import struct
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import NamedTuple

from ..errors import Reason, ShardError

__all__ = ["BLOCK", "MAX_SIZE", "Member", "TarWalk", "group_samples", "is_sample_member"]
__all__ += ["padded", "parse_header", "scan_members", "split_name"]

BLOCK = 512
#: the largest pax or GNU long-name header read; real ones hold a path of a few hundred bytes
MAX_EXTENDED_HEADER = 1 << 20
#: the largest size or offset read: offsets are kept as int64
MAX_SIZE = 1 << 62
_NAME_RE = re.compile(r"^((?:.*/|)[^.]+)[.]([^/]*)$")
_META_RE = re.compile(r"__[^/]*__($|/)")
_REGULAR = (b"0", b"\0", b"7")  # regular file; old tars write NUL; contiguous file
# Types tarfile knows: the data of those that are not regular files is not stepped over.
_SUPPORTED = (*_REGULAR, b"1", b"2", b"3", b"4", b"5", b"6", b"L", b"K", b"S")
_EXTENDED = (b"x", b"X", b"g", b"L", b"K")  # headers that describe the next header
_GNU = (b"L", b"K", b"S")  # types whose prefix field is not a ustar name prefix
_SIGNED = struct.Struct("148b8x356b")
_ZERO_BLOCK = bytes(BLOCK)
# mode, uid, gid, size, mtime, chksum, devmajor, devminor: the header's number fields
_NUMBERS = struct.Struct("100x8s8s8s12s12s8s173x8s8s167x")

Read = Callable[[int, int], "bytes | bytearray | memoryview"]


@dataclass(frozen=True, slots=True)
class Member:
    """One regular file of a tar: name, first header block (pax and long-name headers
    included), data offset and size."""

    name: str
    header_offset: int
    offset: int
    size: int

    @property
    def end(self) -> int:
        return self.offset + self.size


class _Header(NamedTuple):  # a tuple: made three times a sample
    name: str
    size: int
    kind: bytes


def padded(size: int) -> int:
    return -(-size // BLOCK) * BLOCK


def split_name(name: str) -> tuple[str, str] | None:
    """``(key, extension)`` of a member name, as ``webdataset.base_plus_ext`` splits it
    (extension lower-cased); None when the name has no extension."""
    match = _NAME_RE.match(name)
    if match is None:
        return None
    return match.group(1), match.group(2).lower()


def is_sample_member(name: str) -> bool:
    """Whether ``webdataset`` makes this regular file part of a sample."""
    return not _META_RE.match(name) and split_name(name) is not None


def _bad(what: str, offset: int, url: str) -> ShardError:
    message = f"no tar header at offset {offset} ({what}): not a tar, or the index is wrong"
    return ShardError(message, url=url, stage="decode", cause=Reason.NOT_A_TAR)


def _truncated(what: str, offset: int, url: str) -> ShardError:
    message = f"the shard ends inside the {what} at offset {offset}"
    return ShardError(message, url=url, stage="fetch", cause=Reason.TRUNCATED_SHARD)


def _nts(field: bytes) -> bytes:
    end = field.find(b"\0")
    return field if end < 0 else field[:end]


def _number(field: bytes) -> int | None:
    if field[0] in (0o200, 0o377):
        value = int.from_bytes(field[1:], "big")
        return value - 256 ** (len(field) - 1) if field[0] == 0o377 else value
    end = field.find(b"\0")
    digits = field if end < 0 else field[:end]
    if not digits:
        return 0
    try:
        # int() reads bytes as it reads their ASCII text, stripping fewer spaces: what it
        # takes, tarfile's nti takes with the same value; the rest goes the long way.
        return int(digits, 8)
    except ValueError:
        pass
    try:
        return int(digits.decode("ascii").strip() or "0", 8)
    except (UnicodeDecodeError, ValueError):
        return None


# The fields of a header only checked (mode, uid, gid, mtime, devmajor, devminor), which a
# shard's headers mostly repeat.
_checked_number = functools.lru_cache(maxsize=256)(_number)


def _byte_sum(block: bytes) -> int:
    """The sum of a 512-byte block's bytes, the chksum field read as 8 spaces. Adler-32's
    first half is 1 + the sum of the bytes modulo 65521: exact for up to 256 bytes."""
    adler = zlib.adler32
    head = adler(block[:148]) & 0xFFFF
    middle = adler(block[156:412]) & 0xFFFF
    tail = adler(block[412:BLOCK]) & 0xFFFF
    return head + middle + tail - 3 + 8 * 32


def parse_header(block: bytes | bytearray | memoryview, offset: int, url: str) -> _Header | None:
    """The header in one 512-byte ``block`` at ``offset`` of shard ``url``; None for a zero
    block (end of archive). A block that is not a tar header raises ``ShardError``."""
    block = bytes(block)
    if len(block) < BLOCK:
        raise _truncated("tar header", offset, url)
    if block == _ZERO_BLOCK:
        return None
    mode, uid, gid, size_field, mtime, chksum, devmajor, devminor = _NUMBERS.unpack_from(block)
    stored = _number(chksum)
    # some old tars sum signed bytes; tarfile takes either
    if stored != _byte_sum(block) and stored != sum(_SIGNED.unpack(block)) + 8 * 32:
        raise _bad("bad checksum", offset, url)
    fields = [_checked_number(field) for field in (mode, uid, gid, mtime, devmajor, devminor)]
    size = _number(size_field)
    if size is None or None in fields:
        raise _bad("a number field that is not a number", offset, url)
    if size < 0:
        raise _bad(f"a negative size {size}", offset, url)
    kind = block[156:157]
    name = _nts(block[0:100]).decode("utf-8", "surrogateescape")
    if kind == b"\0" and name.endswith("/"):
        kind = b"5"  # a V7 directory: tarfile steps over no data for it
    prefix = _nts(block[345:500]).decode("utf-8", "surrogateescape")
    if prefix and kind not in _GNU:
        name = prefix + "/" + name
    return _Header(name, size, kind)


def _pax_records(data: bytes, offset: int, url: str) -> dict[str, str]:
    """The records ``"<length> <key>=<value>\\n"`` of a pax header, framed exactly, up to the
    end of its blocks or a NUL."""
    records: dict[str, str] = {}
    pos = 0
    while pos < len(data) and data[pos] != 0:
        space = data.find(b" ", pos, pos + 24)
        digits = data[pos:space] if space > pos else b""
        if not (digits.isdigit() and digits.isascii()):
            raise _bad(f"a pax record at byte {pos} without a decimal length", offset, url)
        length = int(digits)
        if length <= space + 1 - pos or pos + length > len(data):
            raise _bad(f"a pax record at byte {pos} of impossible length {length}", offset, url)
        record = data[space + 1 : pos + length]
        key, equals, value = record[:-1].partition(b"=")
        if not key or not equals or record[-1:] != b"\n":
            raise _bad(f"a pax record at byte {pos} without 'key=value\\n'", offset, url)
        try:
            records[key.decode("utf-8")] = value.decode("utf-8", "surrogateescape")
        except UnicodeDecodeError:
            raise _bad(f"a pax record at byte {pos} whose key is not UTF-8", offset, url) from None
        pos += length
    return records


class TarWalk:
    """The regular members of a tar from the header at ``start``, where ``read(offset,
    length)`` gives bytes of the shard (fewer past what it has). Iterating stops at the
    end-of-archive block (:attr:`at_eof`) or when the next header (:attr:`offset`) would
    start at or past ``end``; a member whose data runs past ``end`` is still yielded."""

    def __init__(self, read: Read, start: int, end: int, url: str) -> None:
        self.read = read
        self.offset = start
        self.end = end
        self.url = url
        self.at_eof = False

    def __iter__(self) -> Iterator[Member]:
        while self.offset < self.end:
            found = self._next()
            if found is None:
                return
            member, regular = found
            if regular:
                yield member

    def _next(self) -> tuple[Member, bool] | None:
        start = self.offset
        name: str | None = None
        size: int | None = None
        while True:
            offset = self.offset
            header = parse_header(self.read(offset, BLOCK), offset, self.url)
            if header is None:
                if offset != start:
                    raise _bad("an extended header followed by no member", start, self.url)
                self.at_eof = True
                return None
            data_offset = offset + BLOCK
            if header.kind not in _EXTENDED:
                break
            if header.size > MAX_EXTENDED_HEADER:
                raise _bad(f"an extended header of {header.size} bytes", offset, self.url)
            # tarfile reads records and names to the last block's end, padding included
            data = bytes(self.read(data_offset, padded(header.size)))
            if len(data) < padded(header.size):
                raise _truncated("extended header", offset, self.url)
            if header.kind in (b"x", b"X", b"g"):
                records = _pax_records(data, offset, self.url)
                if any(key.startswith("GNU.sparse.") for key in records):
                    raise _bad("a GNU sparse member, not supported", offset, self.url)
                if header.kind == b"g":
                    if "path" in records or "size" in records:
                        raise _bad("a pax global path or size, not supported", offset, self.url)
                    start = data_offset + padded(header.size)  # not part of the next member
                else:  # the first extended header wins, as tarfile applies them
                    if name is None and "path" in records:
                        name = records["path"].rstrip("/")
                    if size is None and "size" in records:
                        value = records["size"]
                        if not (value.isascii() and value.isdigit()) or len(value) > 19:
                            raise _bad(f"a pax size {value[:40]!r}", offset, self.url)
                        size = int(value)
            elif header.kind == b"L" and name is None:
                name = _nts(data).decode("utf-8", "surrogateescape")
            self.offset = data_offset + padded(header.size)
        if header.kind == b"S":
            raise _bad("a GNU sparse member, not supported", offset, self.url)
        size = header.size if size is None else size
        if size >= MAX_SIZE:
            raise _bad(f"a size of {size} bytes", offset, self.url)
        regular = header.kind in _REGULAR
        steps_over_data = regular or header.kind not in _SUPPORTED
        self.offset = data_offset + (padded(size) if steps_over_data else 0)
        name = header.name if name is None else name
        return Member(name, start, data_offset, size), regular


def scan_members(
    read: Callable[[int, int], bytes | bytearray], size: int, url: str, window: int = 1 << 20
) -> list[Member]:
    """Every member of a whole shard of ``size`` bytes, read ``window`` bytes at a time
    through ``read(offset, length)``; data larger than the window is stepped over."""
    window_start, window_data = 0, b""

    def cached(offset: int, length: int) -> bytes | bytearray | memoryview:
        nonlocal window_start, window_data
        if window_start <= offset and offset + length <= window_start + len(window_data):
            return memoryview(window_data)[offset - window_start : offset - window_start + length]
        if offset >= size:
            return b""
        window_start = offset
        window_data = bytes(read(offset, min(max(window, length), size - offset)))
        return memoryview(window_data)[:length]

    if size == 0:
        raise _bad("the object is empty", 0, url)
    return list(TarWalk(cached, 0, size, url))


def group_samples(members: list[Member], url: str) -> list[tuple[str, list[tuple[str, Member]]]]:
    samples: list[tuple[str, list[tuple[str, Member]]]] = []
    taken: set[str] = set()
    for member in members:
        if not is_sample_member(member.name):
            continue
        split = split_name(member.name)
        assert split is not None
        key, extension = split
        if not samples or samples[-1][0] != key:
            samples.append((key, []))
            taken = {"__key__", "__url__"}  # webdataset's fields of a sample
        if extension in taken:
            raise ShardError(
                f"member {member.name!r} at offset {member.header_offset}: sample {key!r} "
                f"already has a {extension!r} member",
                url=url,
                stage="index",
                cause=Reason.INDEX_MISMATCH,
            )
        taken.add(extension)
        samples[-1][1].append((extension, member))
    return samples
