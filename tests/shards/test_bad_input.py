"""Bad shards over the real S3 server: each is a clear ``ShardError`` (or the fetch error of
its read) naming the shard (``s3://bucket/shard.tar``), the member and its offset, raised
fast; under ``on_error="skip"`` exactly the affected samples are skipped and counted."""

from __future__ import annotations

import json
import re

import pytest

from concurrent_loader import (
    ConcurrentDataLoader,
    LoaderError,
    ObjectNotFound,
    Reason,
    ShardDataset,
    ShardError,
)

MEMBER_AT = re.compile(r"member '(s\d{4}\.\w+)' at offset (\d+)")


def upload(s3_server, bucket: str, prefix: str, objects: dict[str, bytes]) -> str:
    for name, data in objects.items():
        s3_server.put_object(bucket, prefix + name, data)
    return f"s3://{bucket}/{prefix}"


def shard_files(packed, number: int) -> tuple[str, bytes, dict]:
    name = packed.shards[number]
    index = json.loads((packed.local / (name + ".idx")).read_bytes())
    return name, (packed.local / name).read_bytes(), index


def index_bytes(index: dict) -> bytes:
    return json.dumps(index).encode()


def skipped_run(ds: ShardDataset) -> tuple[list[str], ConcurrentDataLoader]:
    """The keys a skipping loader delivers, in order, and the loader (for its counts)."""
    loader = ConcurrentDataLoader(ds, batch_size=16, on_error="skip", max_skipped=len(ds))
    keys = []
    for batch in loader:
        keys.extend(batch["__key__"])
    return keys, loader


def assert_names_member(error: LoaderError, shard_url: str, index: dict) -> None:
    """The error names the shard, and a member at the header offset its index gives."""
    assert error.url == shard_url
    match = MEMBER_AT.search(str(error))
    assert match is not None, str(error)
    headers = {name: header for name, header, _, _ in index["members"]}
    assert headers[match.group(1)] == int(match.group(2)), str(error)


def test_truncated_shard(packed, s3_server, s3_env):
    name, data, index = shard_files(packed, 0)
    cut = len(data) // 2
    url = upload(
        s3_server,
        packed.bucket,
        "bad/truncated/",
        {name: data[:cut], name + ".idx": index_bytes(index)},
    )
    ds = ShardDataset(url)

    def readable(i: int) -> bool:
        try:
            ds.source.reads(i)
        except ShardError:
            return False
        return True

    first_bad = next(i for i in range(len(ds)) if not readable(i))
    assert 0 < first_bad < len(ds)
    assert ds[first_bad - 1]["bin"] == packed.expected[packed.order[first_bad - 1]]["bin"]
    with pytest.raises(ShardError, match="the shard is truncated") as raised:
        ds[first_bad]
    assert raised.value.cause == Reason.TRUNCATED_SHARD
    assert_names_member(raised.value, url + name, index)
    keys, loader = skipped_run(ds)
    assert keys == packed.order[:first_bad]
    assert loader.stats()["skipped"] == len(ds) - first_bad
    assert sorted(s.index for s in loader.skipped) == list(range(first_bad, len(ds)))
    assert all(s.error.cause == Reason.TRUNCATED_SHARD for s in loader.skipped)


def test_member_missing_from_the_index(packed, s3_server, s3_env):
    name, data, index = shard_files(packed, 0)
    # Drop sample 3's label from the index: its bytes still sit inside the sample's span.
    dropped = index["members"].pop(7)
    assert dropped[0].endswith(".txt") and index["members"][6][0] == dropped[0][:-4] + ".bin"
    url = upload(
        s3_server,
        packed.bucket,
        "bad/missing-member/",
        {name: data, name + ".idx": index_bytes(index)},
    )
    ds = ShardDataset(url)
    with pytest.raises(ShardError, match="is in the shard but not in its index") as raised:
        ds[3]
    assert raised.value.cause == Reason.MISSING_MEMBER
    assert f"member '{dropped[0]}' at offset {dropped[1]}" in str(raised.value)
    assert raised.value.url == url + name
    keys, loader = skipped_run(ds)
    assert keys == [k for k in packed.order[: len(ds)] if k != packed.order[3]]
    assert [s.index for s in loader.skipped] == [3]
    assert loader.stats()["skipped"] == 1


def test_index_that_does_not_match_its_shard(packed, s3_server, s3_env):
    name, data, _ = shard_files(packed, 0)
    _, _, other = shard_files(packed, 1)
    url = upload(
        s3_server, packed.bucket, "bad/mismatch/", {name: data, name + ".idx": index_bytes(other)}
    )
    ds = ShardDataset(url)
    with pytest.raises(ShardError) as raised:
        ds[0]
    assert raised.value.cause == Reason.INDEX_MISMATCH
    assert "the shard has 's0000.bin'" in str(raised.value)
    assert_names_member(raised.value, url + name, other)
    keys, loader = skipped_run(ds)
    # Every sample the index lists is refused: none is silently read from the wrong bytes.
    assert keys == []
    assert loader.stats()["skipped"] == len(ds)
    assert {s.error.cause for s in loader.skipped} <= {
        Reason.INDEX_MISMATCH,
        Reason.NOT_A_TAR,
        Reason.TRUNCATED_SHARD,
    }


def test_non_tar_object_without_index(packed, s3_server, s3_env):
    url = upload(s3_server, packed.bucket, "bad/not-tar/", {"junk.tar": b"\x89PNG\r\n" * 500})
    with pytest.raises(ShardError, match="no tar header at offset 0") as raised:
        ShardDataset(url)
    assert raised.value.cause == Reason.NOT_A_TAR
    assert raised.value.url == url + "junk.tar"


def test_non_tar_object_with_an_index(packed, s3_server, s3_env):
    name, data, index = shard_files(packed, 0)
    url = upload(
        s3_server,
        packed.bucket,
        "bad/not-tar-indexed/",
        {name: (b"\x89PNG\r\n\x1a\n" * len(data))[: len(data)], name + ".idx": index_bytes(index)},
    )
    ds = ShardDataset(url)
    with pytest.raises(ShardError, match="no tar header at offset 0") as raised:
        ds[0]
    assert raised.value.cause == Reason.NOT_A_TAR
    assert_names_member(raised.value, url + name, index)
    keys, loader = skipped_run(ds)
    assert keys == [] and loader.stats()["skipped"] == len(ds)


def test_failed_merged_read_fails_exactly_its_samples(packed, s3_server, s3_env):
    """Shard 1 vanishes after its index was read: the merged GETs of its samples fail, each
    of those samples is skipped with the shard, its member and offset named; shard 0 reads."""
    objects = {}
    for number in (0, 1):
        name, data, index = shard_files(packed, number)
        objects |= {name: data, name + ".idx": index_bytes(index)}
    url = upload(s3_server, packed.bucket, "bad/vanishing/", objects)
    ds = ShardDataset(url)
    gone = packed.shards[1]
    s3_server.client().delete_object(Bucket=packed.bucket, Key=f"bad/vanishing/{gone}")
    keys, loader = skipped_run(ds)
    first = ds.shard_lengths[0]
    assert keys == packed.order[:first]
    assert sorted(s.index for s in loader.skipped) == list(range(first, len(ds)))
    _, _, index = shard_files(packed, 1)
    for skipped in loader.skipped:
        assert isinstance(skipped.error, ObjectNotFound)
        assert_names_member(skipped.error, url + gone, index)
        assert ds.source.sample_keys[skipped.index] in str(skipped.error)


def test_member_missing_from_the_index_before_its_indexed_members(packed, s3_server, s3_env):
    name, data, index = shard_files(packed, 0)
    # Drop sample 3's .bin, which the packer writes before its .txt: the sample's span
    # starts where the sample before it ends, so the walk meets the member.
    dropped = index["members"].pop(6)
    assert dropped[0] == "s0003.bin" and index["members"][6][0] == "s0003.txt"
    url = upload(
        s3_server,
        packed.bucket,
        "bad/missing-first-member/",
        {name: data, name + ".idx": index_bytes(index)},
    )
    ds = ShardDataset(url)
    assert ds[2]["bin"] == packed.expected["s0002"]["bin"]
    with pytest.raises(ShardError, match="is in the shard but not in its index") as raised:
        ds[3]
    assert raised.value.cause == Reason.MISSING_MEMBER
    assert f"member '{dropped[0]}' at offset {dropped[1]}" in str(raised.value)
    assert raised.value.url == url + name
    keys, loader = skipped_run(ds)
    assert keys == [k for k in packed.order[: len(ds)] if k != "s0003"]
    assert [s.index for s in loader.skipped] == [3]


def test_member_listed_twice_is_refused_not_an_extra_sample(packed, s3_server, s3_env):
    name, data, index = shard_files(packed, 0)
    twice = index["members"][7]  # s0003.txt, listed again after s0004's members
    index["members"].insert(10, twice)
    url = upload(
        s3_server, packed.bucket, "bad/twice/", {name: data, name + ".idx": index_bytes(index)}
    )
    with pytest.raises(ShardError, match="listed twice, or out of tar order") as raised:
        ShardDataset(url)
    assert raised.value.cause == Reason.INDEX_MISMATCH
    assert f"member '{twice[0]}' at offset {twice[1]}" in str(raised.value)
    assert raised.value.url == url + name + ".idx"


def test_an_index_written_for_a_smaller_shard_is_refused(packed, s3_server, s3_env, tmp_path):
    """The shard grew after its index was written (a member appended, as a re-pack that
    died before uploading its index leaves it): its old index would count the old samples
    only."""
    import io
    import tarfile

    name, data, index = shard_files(packed, 0)
    grown = tmp_path / name
    grown.write_bytes(data)
    with tarfile.open(grown, mode="a") as tar:
        info = tarfile.TarInfo("s9999.bin")
        info.size = 20_000  # past the padding of the last record: the shard grows
        tar.addfile(info, io.BytesIO(bytes(info.size)))
    url = upload(
        s3_server,
        packed.bucket,
        "bad/grown/",
        {name: grown.read_bytes(), name + ".idx": index_bytes(index)},
    )
    with pytest.raises(ShardError, match=f"its index \\({name}.idx\\) was written for") as e:
        ShardDataset(url)
    assert e.value.cause == Reason.INDEX_MISMATCH
    assert e.value.url == url + name
    assert str(len(data)) in str(e.value) and str(grown.stat().st_size) in str(e.value)


@pytest.mark.timeout(60)
def test_a_zero_length_pax_record_fails_its_sample_at_once(packed, s3_server, s3_env):
    """The decode thread walking the sample's headers must not loop on it (CVE-2019-20907's
    pattern): the loader skips exactly that sample, with the shard, member and offset."""
    from ._tars import end, index_of, member, pax_member

    shard = (
        member("s0000.bin", b"1")
        + pax_member(b"0 path=s0001.bin\n", "s0001.bin", b"22")
        + member("s0002.bin", b"333")
        + end()
    )
    entries = [["s0000.bin", 0, 512, 1], ["s0001.bin", 1024, 2560, 2], ["s0002.bin", 3072, 3584, 3]]
    url = upload(
        s3_server,
        packed.bucket,
        "bad/pax-zero/",
        {"a.tar": shard, "a.tar.idx": index_of(shard, entries)},
    )
    ds = ShardDataset(url)
    keys, loader = skipped_run(ds)
    # s0000's span ends with s0001's headers, which it checks
    assert keys == ["s0002"]
    assert [s.index for s in loader.skipped] == [0, 1]
    for skipped, member_at in zip(
        loader.skipped, ("s0000.bin' at offset 0", "s0001.bin' at offset 1024"), strict=True
    ):
        assert isinstance(skipped.error, ShardError)
        assert skipped.error.url == url + "a.tar"
        assert f"member '{member_at}" in str(skipped.error)
        assert "no tar header at offset 1024 (a pax record at byte 0" in str(skipped.error)
