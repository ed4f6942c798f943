"""An entry is served only when every byte of it checks out."""

from __future__ import annotations

from pathlib import Path

import pytest

from concurrent_loader.cache.layout import CorruptEntry, data_checksum, footer

from ._entries import read_entry

SOURCE = "http://127.0.0.1:9000 s3://bucket/images/a.jpg"


def _write(path: Path, data: bytes, etag: str | None = '"abc"', source: str = SOURCE) -> bytes:
    raw = data + footer(len(data), data_checksum(data), etag, source)
    path.write_bytes(raw)
    return raw


def test_an_entry_reads_back_with_its_etag(tmp_path):
    path = tmp_path / "e"
    _write(path, b"hello world")
    entry = read_entry(str(path), SOURCE)
    assert entry is not None
    assert entry.data == b"hello world" and isinstance(entry.data, bytearray)
    assert entry.etag == '"abc"'


def test_an_empty_object_without_etag(tmp_path):
    path = tmp_path / "e"
    _write(path, b"", etag=None)
    entry = read_entry(str(path), SOURCE)
    assert entry is not None and entry.data == b"" and entry.etag is None


def test_no_file_is_no_entry(tmp_path):
    assert read_entry(str(tmp_path / "missing"), SOURCE) is None


def test_every_truncation_is_refused(tmp_path):
    path = tmp_path / "e"
    raw = _write(path, bytes(range(200)))
    for cut in range(len(raw)):
        path.write_bytes(raw[:cut])
        with pytest.raises(CorruptEntry):
            read_entry(str(path), SOURCE)


def test_every_flipped_byte_is_refused(tmp_path):
    path = tmp_path / "e"
    raw = _write(path, bytes(range(100)))
    for at in range(len(raw)):
        flipped = bytearray(raw)
        flipped[at] ^= 0x01
        path.write_bytes(bytes(flipped))
        with pytest.raises(CorruptEntry):
            read_entry(str(path), SOURCE)


def test_an_entry_of_another_object_is_refused(tmp_path):
    path = tmp_path / "e"
    _write(path, b"data", source="s3://bucket/other.jpg")
    with pytest.raises(CorruptEntry, match="another object"):
        read_entry(str(path), SOURCE)


def test_a_buffer_changed_after_its_checksum_makes_a_bad_entry(tmp_path):
    data = bytearray(b"original bytes")
    crc = data_checksum(data)
    data[0] = ord("X")  # the caller changed the buffer before the writer wrote it
    (tmp_path / "e").write_bytes(bytes(data) + footer(len(data), crc, None, SOURCE))
    with pytest.raises(CorruptEntry, match="checksum"):
        read_entry(str(tmp_path / "e"), SOURCE)
