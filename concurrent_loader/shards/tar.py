"""Tar archives as bytes: headers, members, and WebDataset's grouping of members into samples.

Pure functions over ``bytes``; no file, socket or event loop. A member's header is a
512-byte ustar block, optionally preceded by a pax extended header (``x``, whose ``path``
and ``size`` records override the block's) or a GNU long name (``L``); pax global headers
(``g``) are skipped. Every header's checksum is verified: a block that is neither a valid
header nor the end-of-archive zero block is refused with
:class:`~concurrent_loader.errors.ShardError`.

Grouping follows the ``webdataset`` library exactly (``tariterators.py``), so a shard reads
as the same samples here and there:

- only regular files are members; names matching ``__[^/]*__($|/)`` at the start, and
  top-level names starting and ending with ``__``, are metadata and skipped;
- a name splits into key and extension at the first dot of its last path component
  (``^((?:.*/|)[^.]+)[.]([^/]*)$``: ``a/b.seg.jpg`` is key ``a/b``, extension
  ``seg.jpg``); a name without one is skipped; extensions are lower-cased;
- consecutive members with the same key form one sample; two members of one sample with
  the same extension are an error (``webdataset`` raises ``ValueError``).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from ..errors import Reason, ShardError

__all__ = [
    "BLOCK",
    "Member",
    "group_samples",
    "is_sample_member",
    "padded",
    "parse_header",
    "read_members",
    "scan_members",
    "split_name",
]

BLOCK = 512
_NAME_RE = re.compile(r"^((?:.*/|)[^.]+)[.]([^/]*)$")
_META_RE = re.compile(r"__[^/]*__($|/)")
_REGULAR = (b"0", b"\0", b"7")  # regular file; old tars write NUL; contiguous file


@dataclass(frozen=True, slots=True)
class Member:
    """One regular file of a tar: its name, where its first header block starts (pax and
    long-name headers included), where its data starts, and its size in bytes."""

    name: str
    header_offset: int
    offset: int
    size: int

    @property
    def end(self) -> int:
        return self.offset + self.size


@dataclass(frozen=True, slots=True)
class _Header:
    name: str
    size: int
    kind: bytes


def padded(size: int) -> int:
    """``size`` rounded up to whole 512-byte blocks."""
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
    if "/" not in name and name.startswith("__") and name.endswith("__"):
        return False
    if _META_RE.match(name):
        return False
    return split_name(name) is not None


def _octal(field: bytes) -> int:
    field = field.rstrip(b"\0 ").lstrip(b" ")
    if field and field[0] & 0x80:  # GNU base-256 for sizes of 8 GiB and more
        value = int.from_bytes(field, "big") & ~(0x80 << (8 * (len(field) - 1)))
        return value
    return int(field, 8) if field else 0


def parse_header(block: bytes | bytearray | memoryview, offset: int, url: str) -> _Header | None:
    """The header in one 512-byte ``block`` at ``offset`` of shard ``url``; None for a zero
    block (end of archive). A block that is not a tar header raises ``ShardError``."""
    block = bytes(block)
    if len(block) < BLOCK:
        raise ShardError(
            f"the shard ends inside the tar header at offset {offset}",
            url=url,
            stage="fetch",
            cause=Reason.TRUNCATED_SHARD,
        )
    if block == bytes(BLOCK):
        return None
    try:
        stored = _octal(block[148:156])
        size = _octal(block[124:136])
    except ValueError:
        stored = size = -1
    computed = sum(block[:148]) + 8 * 32 + sum(block[156:])
    if stored != computed or size < 0:
        raise ShardError(
            f"no tar header at offset {offset} (bad checksum): not a tar, or the index does "
            "not match the shard",
            url=url,
            stage="decode",
            cause=Reason.NOT_A_TAR,
        )
    name = block[0:100].split(b"\0", 1)[0]
    if block[257:262] == b"ustar":
        prefix = block[345:500].split(b"\0", 1)[0]
        if prefix:
            name = prefix + b"/" + name
    return _Header(name.decode("utf-8", "surrogateescape"), size, block[156:157])


def _pax_records(data: bytes) -> dict[str, str]:
    records: dict[str, str] = {}
    pos = 0
    while pos < len(data):
        space = data.index(b" ", pos)
        length = int(data[pos:space])
        key, _, value = data[space + 1 : pos + length - 1].partition(b"=")
        records[key.decode("utf-8")] = value.decode("utf-8", "surrogateescape")
        pos += length
    return records


def read_members(
    read: Callable[[int, int], bytes | bytearray | memoryview], start: int, end: int, url: str
) -> Iterator[Member]:
    """The members of a tar between ``start`` (a header) and ``end``, where
    ``read(offset, length)`` gives bytes of the shard (fewer at its end). Stops at the end
    of the archive or at ``end``; non-regular members are skipped. A member whose data
    runs past the shard's end is still yielded (reading it fails as truncated)."""
    offset = start
    pending_name: str | None = None
    pending_size: int | None = None
    member_start = offset
    while offset + BLOCK <= end:
        header = parse_header(read(offset, BLOCK), offset, url)
        if header is None:
            return
        data_offset = offset + BLOCK
        if header.kind in (b"x", b"L", b"g"):
            if data_offset + header.size > end:
                return  # the member it describes is past what is walked
            data = bytes(read(data_offset, header.size))
            if len(data) < header.size:
                raise ShardError(
                    f"the shard ends inside the extended header at offset {offset}",
                    url=url,
                    stage="fetch",
                    cause=Reason.TRUNCATED_SHARD,
                )
            if header.kind == b"x":
                records = _pax_records(data)
                pending_name = records.get("path", pending_name)
                if "size" in records:
                    pending_size = int(records["size"])
            elif header.kind == b"L":
                pending_name = data.split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
            offset = data_offset + padded(header.size)
            if header.kind == b"g":
                member_start = offset
            continue
        size = pending_size if pending_size is not None else header.size
        name = pending_name if pending_name is not None else header.name
        if header.kind in _REGULAR:
            yield Member(name, member_start, data_offset, size)
        offset = data_offset + padded(size)
        member_start = offset
        pending_name = pending_size = None


def scan_members(
    read: Callable[[int, int], bytes | bytearray], size: int, url: str, window: int = 1 << 20
) -> list[Member]:
    """Every member of a whole shard of ``size`` bytes, reading it ``window`` bytes at a
    time through ``read(offset, length)`` (one ranged GET each); members larger than the
    window are stepped over, not read."""
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
        raise ShardError(
            "the object is empty, not a tar", url=url, stage="decode", cause=Reason.NOT_A_TAR
        )
    return list(read_members(cached, 0, size, url))


def group_samples(members: list[Member], url: str) -> list[tuple[str, list[tuple[str, Member]]]]:
    """Samples of a shard, in tar order: ``(key, [(extension, member), ...])``."""
    samples: list[tuple[str, list[tuple[str, Member]]]] = []
    for member in members:
        if not is_sample_member(member.name):
            continue
        split = split_name(member.name)
        assert split is not None
        key, extension = split
        if not samples or samples[-1][0] != key:
            samples.append((key, []))
        parts = samples[-1][1]
        if any(extension == seen for seen, _ in parts):
            raise ShardError(
                f"member {member.name!r} at offset {member.header_offset}: sample {key!r} "
                f"already has a {extension!r} member",
                url=url,
                stage="index",
                cause=Reason.INDEX_MISMATCH,
            )
        parts.append((extension, member))
    return samples
