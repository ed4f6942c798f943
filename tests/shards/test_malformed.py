"""Malformed tar headers and hostile indexes, on the in-memory store and a local directory:
each is a ``ShardError`` naming the shard, the member when it is known and the byte offset,
raised at once (a per-test timeout stands for "never a hang"), never another exception, a
silently shorter shard or a sample the shard does not have."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import pytest

from concurrent_loader import ConfigError, Reason, ShardDataset, ShardError
from concurrent_loader.testing.memory import MemoryConfig

from ._tars import end, header, index_of, make_tar, member, pad, pax_member, true_index

pytestmark = pytest.mark.timeout(20)

B_PAX = 1024  # where the second member's headers start, after a.bin's header and data


def dataset(where: str, tmp_path: Path, objects: dict[str, bytes]) -> ShardDataset:
    """The objects as shards in memory or in a local directory."""
    if where == "memory":
        return ShardDataset(MemoryConfig(objects, name="m"))
    for name, data in objects.items():
        (tmp_path / name).write_bytes(data)
    return ShardDataset(str(tmp_path))


def url_of(where: str, tmp_path: Path) -> str:
    return "memory://m/a.tar" if where == "memory" else str(tmp_path / "a.tar")


WHERE = ["memory", "local"]

PAX_RECORDS = {
    "length 0 (CVE-2019-20907's loop)": b"0 path=b.bin\n",
    "no space": b"13path=b.bin\n",
    "a length that is not a number": b"1x path=b.bin\n",
    "a key that is not UTF-8": b"9 \xff\xfe=ab\n",
    "a length past the header's data": b"99 path=b.bin\n",
    "no newline": b"13 path=b.bin!",
    "a size that is not a number": b"15 size=12ab3\n",
}


def with_pax(records: bytes) -> bytes:
    return member("a.bin", b"1") + pax_member(records, "b.bin", b"22") + end()


@pytest.mark.parametrize("where", WHERE)
@pytest.mark.parametrize("records", PAX_RECORDS.values(), ids=PAX_RECORDS.keys())
def test_a_malformed_pax_header_is_refused_when_scanned(where, records, tmp_path):
    with pytest.raises(ShardError, match=f"no tar header at offset {B_PAX} \\(a pax record") as e:
        dataset(where, tmp_path, {"a.tar": with_pax(records)})
    assert e.value.url == url_of(where, tmp_path)
    assert e.value.cause == Reason.NOT_A_TAR


@pytest.mark.parametrize("where", WHERE)
@pytest.mark.parametrize("records", PAX_RECORDS.values(), ids=PAX_RECORDS.keys())
def test_a_malformed_pax_header_fails_its_sample_when_indexed(where, records, tmp_path):
    shard = with_pax(records)
    entries = [["a.bin", 0, 512, 1], ["b.bin", B_PAX, B_PAX + 3 * 512, 2]]
    objects = {"a.tar": shard, "a.tar.idx": index_of(shard, entries), "c.tar": with_pax(b"")}
    ds = dataset(where, tmp_path, objects)
    # a's span ends with b's headers, which it checks: both samples fail, c's read
    for i, where_in_shard in enumerate(
        ["'a', member 'a.bin' at offset 0", "'b', member 'b.bin' at offset 1024"]
    ):
        with pytest.raises(ShardError, match=f"no tar header at offset {B_PAX} \\(a pax rec") as e:
            ds[i]
        assert e.value.url == url_of(where, tmp_path)
        assert f"sample {where_in_shard}" in str(e.value)
    assert [ds[i]["bin"] for i in (2, 3)] == [b"1", b"22"]


BAD_HEADERS = {
    "a bad checksum": (header("b.bin", 2, checksum=False) + pad(b"22") + end(), B_PAX),
    "a size that is not octal": (header("b.bin", 0, size_field=b"0000000009x\0") + end(), B_PAX),
    "a GNU long name of 1 GB": (header("././@LongLink", 10**9, b"L") + pad(b"n") + end(), B_PAX),
    "a GNU long name past the end": (header("././@LongLink", 5000, b"L") + pad(b"n"), B_PAX),
    "a pax header past the end": (header("././@PaxHeader", 5000, b"x") + pad(b"n"), B_PAX),
    "a pax header and then no member": (header("././@PaxHeader", 0, b"x") + end(), B_PAX),
    "a GNU sparse member": (header("b.bin", 0, b"S") + end(), B_PAX),
    "a size past int64": (
        header("b.bin", 0, size_field=b"\x80" + (2**70).to_bytes(11, "big")),
        B_PAX,
    ),
    "a pax size of 5000 digits": (pax_member(b"5011 size=" + b"1" * 5000 + b"\n", "b", b""), B_PAX),
}


@pytest.mark.parametrize("where", WHERE)
@pytest.mark.parametrize("tail,offset", BAD_HEADERS.values(), ids=BAD_HEADERS.keys())
def test_a_malformed_header_is_refused_with_its_offset(where, tail, offset, tmp_path):
    shard = member("a.bin", b"1") + tail
    with pytest.raises(ShardError, match=f" at offset {offset}") as e:
        dataset(where, tmp_path, {"a.tar": shard})
    assert e.value.url == url_of(where, tmp_path)
    assert e.value.cause in (Reason.NOT_A_TAR, Reason.TRUNCATED_SHARD)


@pytest.mark.parametrize("where", WHERE)
@pytest.mark.parametrize("cut", [100, 511])
def test_a_shard_cut_inside_a_header_is_truncated_not_shorter(where, cut, tmp_path):
    shard = make_tar([("a.bin", b"1"), ("b.bin", b"22")], tarfile.USTAR_FORMAT)
    with pytest.raises(ShardError, match=f"ends inside the tar header at offset {B_PAX}") as e:
        dataset(where, tmp_path, {"a.tar": shard[: B_PAX + cut]})
    assert e.value.cause == Reason.TRUNCATED_SHARD


def test_a_member_whose_size_runs_past_the_shard_fails_as_truncated(tmp_path):
    shard = member("a.bin", b"1") + header("b.bin", 10**6) + pad(b"22")
    ds = dataset("memory", tmp_path, {"a.tar": shard})
    assert ds[0]["bin"] == b"1"
    with pytest.raises(ShardError, match="member 'b.bin' at offset 1024") as e:
        ds[1]
    assert e.value.cause == Reason.TRUNCATED_SHARD


# ---------------------------------------------------------------------- hostile indexes

NESTED = make_tar([("evil.bin", b"EVIL")], tarfile.USTAR_FORMAT)
# a.bin holds a tar; its data starts at 512, so the nested member's header is at 512
OUTER = make_tar([("a.bin", NESTED), ("b.bin", b"22")], tarfile.USTAR_FORMAT)
B_OUTER = 512 + len(NESTED)

HOSTILE = {
    # the first sample's walk starts at the shard's start and meets a.bin, not indexed
    "a member inside another's data, alone": ([["evil.bin", 512, 1024, 4]], "read"),
    "a member inside another's data, after it": (
        [["a.bin", 0, 512, len(NESTED)], ["evil.bin", 512, 1024, 4]],
        "load",  # the two overlap
    ),
    # the walk from the shard's start to b's headers meets a.bin; b's own walk starts
    # where evil.bin would end, inside a.bin (at the nested tar's end-of-archive block)
    "a member inside another's data, before the next": (
        [["evil.bin", 512, 1024, 4], ["b.bin", B_OUTER, B_OUTER + 512, 2]],
        "read",
    ),
}


def test_the_hostile_indexes_are_written_against_this_layout():
    assert true_index(NESTED) == [["evil.bin", 0, 512, 4]]
    assert true_index(OUTER) == [
        ["a.bin", 0, 512, len(NESTED)],
        ["b.bin", B_OUTER, B_OUTER + 512, 2],
    ]


@pytest.mark.parametrize("where", WHERE)
@pytest.mark.parametrize("entries,when", HOSTILE.values(), ids=HOSTILE.keys())
def test_an_index_pointing_inside_a_member_gives_no_sample_of_it(where, entries, when, tmp_path):
    objects = {"a.tar": OUTER, "a.tar.idx": index_of(OUTER, entries)}
    if when == "load":
        with pytest.raises(ShardError, match="'evil.bin' at offset 512") as e:
            dataset(where, tmp_path, objects)
        assert e.value.cause == Reason.INDEX_MISMATCH
        return
    ds = dataset(where, tmp_path, objects)
    with pytest.raises(ShardError, match="member 'a.bin' at offset 0 is in the shard but not") as e:
        ds[0]
    assert e.value.cause == Reason.MISSING_MEMBER
    assert e.value.url == url_of(where, tmp_path)
    assert "sample 'evil', member 'evil.bin' at offset 512" in str(e.value)
    for i in range(1, len(ds)):
        with pytest.raises(ShardError, match="the archive ends before it") as e:
            ds[i]
        assert e.value.cause == Reason.INDEX_MISMATCH


BAD_ENTRIES = {
    "a negative header offset": ["a.bin", -512, 0, 1],
    "a negative data offset": ["a.bin", 0, -512, 1],
    "a negative size": ["a.bin", 0, 512, -1],
    "an offset past int64": ["a.bin", 0, 2**70, 1],
    "a size past int64": ["a.bin", 0, 512, 2**70],
    "a fractional offset": ["a.bin", 0, 512.5, 1],
    "a header not on a block": ["a.bin", 100, 612, 1],
    "data past the shard's end": ["a.bin", 0, 512, 10**6],
    "a name that is no sample member": ["__meta__", 0, 512, 1],
    "a boolean size": ["a.bin", 0, 512, True],
}


@pytest.mark.parametrize("where", WHERE)
@pytest.mark.parametrize("entry", BAD_ENTRIES.values(), ids=BAD_ENTRIES.keys())
def test_an_impossible_index_entry_is_refused_when_read(where, entry, tmp_path):
    shard = make_tar([("a.bin", b"1")], tarfile.USTAR_FORMAT)
    index = index_of(shard, [entry])
    with pytest.raises(ShardError) as e:
        dataset(where, tmp_path, {"a.tar": shard, "a.tar.idx": index})
    assert e.value.url == url_of(where, tmp_path) + ".idx"
    assert e.value.cause == Reason.INDEX_MISMATCH
    assert json.dumps(entry[0]).strip('"') in str(e.value)


@pytest.mark.parametrize("where", WHERE)
def test_a_member_listed_twice_is_refused_when_the_index_is_read(where, tmp_path):
    shard = make_tar([("a.bin", b"1"), ("a.txt", b"x"), ("b.bin", b"2")], tarfile.USTAR_FORMAT)
    entries = true_index(shard)
    index = index_of(shard, [*entries, entries[1]])  # a.txt again, after b: a sample "a"
    with pytest.raises(ShardError, match="'a.txt' at offset 1024.*listed twice") as e:
        dataset(where, tmp_path, {"a.tar": shard, "a.tar.idx": index})
    assert e.value.cause == Reason.INDEX_MISMATCH


def test_the_node_cache_is_refused_with_what_to_use_instead(tmp_path):
    shard = make_tar([("a.bin", b"1")])
    with pytest.raises(ConfigError, match="does not read through the node cache") as e:
        ShardDataset(MemoryConfig({"a.tar": shard}, name="m"), cache=str(tmp_path / "cache"))
    assert "readahead=Readahead()" in str(e.value)


@pytest.mark.parametrize("where", WHERE)
@pytest.mark.parametrize("left_out", [0, 1], ids=["the first sample", "the last sample"])
def test_a_sample_left_out_of_the_index_at_either_end_is_a_missing_member(
    where, left_out, tmp_path
):
    """No neighbour's walk sees a sample before the first one listed or after the last one:
    the listed sample next to it does, as for a sample left out between two listed ones."""
    shard = make_tar([("a.bin", b"1"), ("b.bin", b"22")], tarfile.USTAR_FORMAT)
    entries = true_index(shard)
    dropped = entries.pop(left_out)
    ds = dataset(where, tmp_path, {"a.tar": shard, "a.tar.idx": index_of(shard, entries)})
    with pytest.raises(ShardError, match="is in the shard but not in its index") as e:
        ds[0]
    assert e.value.cause == Reason.MISSING_MEMBER
    assert f"member '{dropped[0]}' at offset {dropped[1]}" in str(e.value)
    assert e.value.url == url_of(where, tmp_path)


@pytest.mark.parametrize("where", WHERE)
def test_headers_running_past_the_next_samples_indexed_data_are_an_index_mismatch(where, tmp_path):
    """The index puts b.bin's data where its pax header's data is: a's walk meets the pax
    header at the end of its span and would read past it. The shard is whole: it is the
    index that is wrong, not the shard that is cut."""
    shard = member("a.bin", b"1") + pax_member(b"14 path=b.bin\n", "b.bin", b"22") + end()
    entries = [["a.bin", 0, 512, 1], ["b.bin", B_PAX, B_PAX + 512, 2]]
    ds = dataset(where, tmp_path, {"a.tar": shard, "a.tar.idx": index_of(shard, entries)})
    for i in range(2):
        with pytest.raises(ShardError) as e:
            ds[i]
        assert e.value.cause == Reason.INDEX_MISMATCH, e.value
        assert e.value.url == url_of(where, tmp_path)
