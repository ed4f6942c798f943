"""Tar bytes for the shard tests, valid or not, written block by block.

``tarfile`` writes the valid ones; the helpers here write what it never would (a pax header
with any records, a header with any field), each header with a correct checksum unless
asked otherwise, so that a test reaches the check it means to reach.
"""

from __future__ import annotations

import io
import json
import tarfile

BLOCK = 512


def pad(data: bytes) -> bytes:
    return data + bytes(-len(data) % BLOCK)


def make_tar(members: list[tuple[str, bytes]], fmt: int = tarfile.PAX_FORMAT) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=fmt) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def header(
    name: str | bytes,
    size: int,
    kind: bytes = tarfile.REGTYPE,
    *,
    size_field: bytes | None = None,
    checksum: bool = True,
) -> bytes:
    """One ustar header block; ``size_field`` replaces the 12 bytes of the size field."""
    block = bytearray(BLOCK)
    raw = name.encode() if isinstance(name, str) else name
    block[0 : len(raw)] = raw
    block[100:108] = b"0000644\0"
    block[108:116] = block[116:124] = b"0000000\0"
    block[124:136] = size_field if size_field is not None else b"%011o\0" % size
    block[136:148] = b"00000000000\0"
    block[156:157] = kind
    block[257:265] = b"ustar\x0000"
    block[148:156] = b" " * 8
    value = sum(block) if checksum else sum(block) + 1
    block[148:156] = b"%06o\0 " % value
    return bytes(block)


def member(name: str, data: bytes) -> bytes:
    """A plain ustar member: header and padded data."""
    return header(name, len(data)) + pad(data)


def pax_member(records: bytes, name: str, data: bytes) -> bytes:
    """A member preceded by a pax header holding exactly ``records``."""
    return header("././@PaxHeader", len(records), b"x") + pad(records) + member(name, data)


def end() -> bytes:
    return bytes(2 * BLOCK)


def index_of(shard: bytes, members: list[list]) -> bytes:
    """An index document (as ``concurrent-loader pack`` writes one) listing ``members``."""
    document = {
        "format": "concurrent-loader/tar-index",
        "version": 1,
        "size": len(shard),
        "members": members,
    }
    return json.dumps(document).encode()


def true_index(shard: bytes) -> list[list]:
    """The members ``tarfile`` finds in ``shard``, as index entries."""
    with tarfile.open(fileobj=io.BytesIO(shard)) as tar:
        return [[i.name, i.offset, i.offset_data, i.size] for i in tar.getmembers() if i.isreg()]
