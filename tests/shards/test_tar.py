"""Tar headers, members and samples from bytes, checked against Python's ``tarfile`` and
the ``webdataset`` library's own splitting and grouping rules."""

from __future__ import annotations

import io
import tarfile

import pytest

from concurrent_loader.errors import Reason, ShardError
from concurrent_loader.shards.tar import (
    Member,
    group_samples,
    is_sample_member,
    scan_members,
    split_name,
)

from ._tars import end, header, make_tar, member, pad

webdataset = pytest.importorskip("webdataset", reason="webdataset is in requirements-dev.txt")
from webdataset.tariterators import base_plus_ext  # noqa: E402


def reader(data: bytes):
    def read(offset: int, length: int) -> bytes:
        return data[offset : offset + length]

    return read


NAMES = [
    "a.jpg",
    "dir/b.seg.png",
    "dir.x/c.JPG",
    "no_extension",
    "dir/.hidden",
    "x/y/z.tar.gz",
    "weird..txt",
    "trailing.",
]


@pytest.mark.parametrize("name", NAMES)
def test_names_split_as_webdataset_splits_them(name):
    key, ext = base_plus_ext(name)
    expected = None if key is None else (key, ext.lower())
    assert split_name(name) == expected


@pytest.mark.parametrize(
    "name,member",
    [("__meta__", False), ("__x__/a.jpg", False), ("a/__b__.jpg", True), ("k.cls", True)],
)
def test_metadata_names_are_not_sample_members(name, member):
    assert is_sample_member(name) is member


@pytest.mark.parametrize("fmt", [tarfile.PAX_FORMAT, tarfile.GNU_FORMAT, tarfile.USTAR_FORMAT])
def test_scan_finds_every_member_where_tarfile_does(fmt):
    long_dir = "d" * 120 if fmt != tarfile.USTAR_FORMAT else "d" * 60
    members = [
        ("a.jpg", b"x" * 1000),
        (f"{long_dir}/b.jpg", b"y" * 512),
        ("c.txt", b""),
        ("é/ü.bin", b"z" * 3),
    ]
    if fmt == tarfile.USTAR_FORMAT:
        members = members[:3]
    data = make_tar(members, fmt)
    found = scan_members(reader(data), len(data), "s3://b/t.tar", window=700)
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        infos = tar.getmembers()
    assert [(m.name, m.offset, m.size) for m in found] == [
        (i.name, i.offset_data, i.size) for i in infos
    ]
    assert [m.header_offset for m in found] == [i.offset for i in infos]


def test_samples_group_consecutive_members_with_one_key():
    data = make_tar([("a.jpg", b"1"), ("a.CLS", b"2"), ("b.jpg", b"3"), ("a.txt", b"4")])
    samples = group_samples(scan_members(reader(data), len(data), "u"), "u")
    assert [(key, [ext for ext, _ in parts]) for key, parts in samples] == [
        ("a", ["jpg", "cls"]),
        ("b", ["jpg"]),
        ("a", ["txt"]),
    ]


def test_a_repeated_extension_in_one_sample_is_refused():
    data = make_tar([("a.jpg", b"1"), ("a.jpg", b"2")])
    with pytest.raises(ShardError, match="already has a 'jpg' member") as raised:
        group_samples(scan_members(reader(data), len(data), "s3://b/t.tar"), "s3://b/t.tar")
    assert raised.value.url == "s3://b/t.tar"


def test_a_non_tar_object_is_refused_with_its_offset():
    data = b"\xff\xd8 this is a JPEG, not a tar" * 40
    with pytest.raises(ShardError, match="no tar header at offset 0") as raised:
        scan_members(reader(data), len(data), "s3://b/not.tar")
    assert raised.value.cause == Reason.NOT_A_TAR
    assert raised.value.url == "s3://b/not.tar"


def test_an_empty_object_is_not_a_tar():
    with pytest.raises(ShardError) as raised:
        scan_members(reader(b""), 0, "s3://b/empty.tar")
    assert raised.value.cause == Reason.NOT_A_TAR


def test_a_truncated_shard_keeps_the_member_it_cut():
    data = make_tar([("a.jpg", b"1" * 600), ("b.jpg", b"2" * 2000)])
    cut = data[: 512 * 4 + 100]  # inside b.jpg's data
    found = scan_members(reader(cut), len(cut), "u")
    assert [m.name for m in found] == ["a.jpg", "b.jpg"]
    assert found[1].end > len(cut)


EXTENDED_INTO_PADDING = {
    # tarfile reads an extended header's records (a long name) to its last block's end
    "pax records past the header's size": (b"x", b"14 path=b.bin\n", b"14 path=c.bin\n"),
    "a long name past the header's size": (b"L", b"b.bin", b"xyz\0"),
}


@pytest.mark.parametrize(
    "kind,data,in_padding", EXTENDED_INTO_PADDING.values(), ids=EXTENDED_INTO_PADDING.keys()
)
def test_an_extended_header_is_read_to_its_block_end_as_tarfile_reads_it(kind, data, in_padding):
    shard = (
        member("a.bin", b"1")
        + header("././@LongLink", len(data), kind)
        + pad(data + in_padding)
        + member("x.bin", b"22")
        + end()
    )
    with tarfile.open(fileobj=io.BytesIO(shard)) as tar:
        names = [info.name for info in tar.getmembers()]
    found = scan_members(reader(shard), len(shard), "u")
    assert [m.name for m in found] == names


@pytest.mark.parametrize("extension", ["__key__", "__URL__"])
def test_an_extension_naming_a_samples_own_field_is_refused(extension):
    """webdataset refuses it as a duplicate of the sample's ``__key__`` or ``__url__``; it
    must not replace the key or URL of the sample."""
    from webdataset.tariterators import group_by_keys, tar_file_expander

    data = make_tar([("a.bin", b"1"), (f"a.{extension}", b"2")])
    files = tar_file_expander([{"url": "u", "stream": io.BytesIO(data)}])
    with pytest.raises(ValueError, match="duplicate"):
        list(group_by_keys(files))
    with pytest.raises(ShardError, match=f"already has a '{extension.lower()}' member"):
        group_samples(scan_members(reader(data), len(data), "u"), "u")


@pytest.mark.timeout(5)
def test_grouping_a_sample_of_many_members_takes_linear_time():
    members = [Member(f"a.e{i}", 1024 * i, 1024 * i + 512, 1) for i in range(50_000)]
    ((key, parts),) = group_samples(members, "u")
    assert key == "a" and len(parts) == 50_000
