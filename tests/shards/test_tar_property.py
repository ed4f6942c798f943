"""The tar reader against the ``webdataset`` library, on random shards (seeded).

Valid shards (random member names with several extensions, nested directories, names long
enough for pax or GNU headers, sizes 0 to a few KB including multiples of 512, metadata
members, directories and links among the members) read as exactly the samples
``webdataset`` reads, with and without an index. Corrupted ones (flipped bytes in headers
and data, truncations, bogus headers, hostile indexes) end, each within a bounded time, in
a ``ShardError`` naming the shard, or in samples that ``webdataset`` reads from the
corrupted shard (or, with an index, that the shard had before: the index's other samples
are read in place); never a hang, another exception or a sample that is neither.
"""

from __future__ import annotations

import io
import json
import random
import tarfile
import threading
from collections.abc import Callable
from typing import Any

import pytest

from concurrent_loader import ConfigError, Reason, ShardDataset, ShardError
from concurrent_loader.testing.memory import MemoryConfig

from ._tars import BLOCK, header, pad

pytest.importorskip("webdataset", reason="webdataset is in requirements-dev.txt")
from webdataset.tariterators import group_by_keys, tar_file_expander

URL = "memory://p/a.tar"
CASE_TIMEOUT_S = 5.0
EXTENSIONS = ["jpg", "cls", "txt", "seg.png", "JSON", "tar.gz", "x"]
SIZES = [0, 1, 100, 511, 512, 513, 1024, 1500, 2048, 3000]

Sample = tuple[str, tuple[tuple[str, bytes], ...]]


# ---------------------------------------------------------------------- random shards


def random_name(rng: random.Random, key: str) -> str:
    return f"{key}.{rng.choice(EXTENSIONS)}"


def random_key(rng: random.Random, number: int) -> str:
    depth = rng.choice([0, 0, 1, 2])
    parts = [f"d{rng.randrange(3)}" for _ in range(depth)]
    stem = f"k{number}"
    if rng.random() < 0.2:  # past ustar's 100-byte name: a pax path or a GNU long name
        stem += "_" + "n" * rng.randrange(100, 160)
    if rng.random() < 0.1:
        stem += "é"  # not ASCII: a pax path under PAX_FORMAT
    return "/".join([*parts, stem])


def random_shard(rng: random.Random) -> bytes:
    fmt = rng.choice([tarfile.PAX_FORMAT, tarfile.GNU_FORMAT])
    out = io.BytesIO()
    pax_headers = (
        {"comment": "global"} if fmt == tarfile.PAX_FORMAT and rng.random() < 0.2 else None
    )
    with tarfile.open(fileobj=out, mode="w", format=fmt, pax_headers=pax_headers) as tar:
        keys = [random_key(rng, n) for n in range(rng.randrange(1, 7))]
        if len(keys) > 2 and rng.random() < 0.2:
            keys.append(keys[0])  # a key again, later: webdataset makes it a new sample
        for key in keys:
            extensions = rng.sample(EXTENSIONS, rng.randrange(1, 4))
            for extension in sorted(extensions):
                size = rng.choice(SIZES) if rng.random() < 0.7 else rng.randrange(0, 4000)
                add(tar, f"{key}.{extension}", bytes(rng.randrange(256) for _ in range(size)))
            roll = rng.random()
            if roll < 0.1:
                add(tar, "__meta__", b"{}")
            elif roll < 0.2:
                info = tarfile.TarInfo(f"d{rng.randrange(3)}")
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            elif roll < 0.25:
                info = tarfile.TarInfo("link.jpg")
                info.type = tarfile.SYMTYPE
                info.linkname = key
                tar.addfile(info)
            elif roll < 0.3:
                add(tar, "no_extension", b"z")
    return out.getvalue()


def add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def tarfile_index(shard: bytes) -> list[list[Any]]:
    """The shard's sample members as an index lists them, found by ``tarfile`` (headers
    from the first one of each member, as the packer records them)."""
    from concurrent_loader.shards.tar import is_sample_member

    with tarfile.open(fileobj=io.BytesIO(shard)) as tar:
        return [
            [i.name, i.offset, i.offset_data, i.size]
            for i in tar.getmembers()
            if i.isreg() and is_sample_member(i.name)
        ]


def index_document(size: int, members: list[list[Any]]) -> bytes:
    document = {"format": "concurrent-loader/tar-index", "version": 1, "size": size}
    return json.dumps(document | {"members": members}).encode()


# ---------------------------------------------------------------------- the two readers


def webdataset_read(shard: bytes) -> tuple[list[Sample], bool]:
    """The samples ``webdataset`` reads, and whether it read to the end without an error."""
    samples: list[Sample] = []
    try:
        stream = io.BytesIO(shard)
        files = tar_file_expander([{"url": URL, "stream": stream}])
        for sample in group_by_keys(files):
            samples.append(as_sample(sample))
    except Exception:
        return samples, False
    return samples, True


def as_sample(sample: dict[str, Any]) -> Sample:
    return sample["__key__"], tuple(
        sorted((k, bytes(v)) for k, v in sample.items() if not k.startswith("__"))
    )


def our_read(shard: bytes, index: bytes | None) -> list[Sample | ShardError] | ShardError:
    """Our samples (a ``ShardError`` in place of each refused one), or the ``ShardError``
    that refused the shard. Any other exception escapes."""
    objects = {"a.tar": shard} if index is None else {"a.tar": shard, "a.tar.idx": index}
    try:
        ds = ShardDataset(MemoryConfig(objects, name="p"))
    except ShardError as exc:
        return exc
    except ConfigError as exc:
        if exc.cause != Reason.EMPTY_PREFIX:
            raise
        return []  # no sample in the shard
    found: list[Sample | ShardError] = []
    with ds:
        for i in range(len(ds)):
            try:
                found.append(as_sample(ds[i]))
            except ShardError as exc:
                found.append(exc)
    return found


def bounded(call: Callable[[], Any]) -> Any:
    """``call()`` on a thread, which must end within ``CASE_TIMEOUT_S``."""
    result: list[Any] = []

    def run() -> None:
        try:
            result.append(("ok", call()))
        except BaseException as exc:
            result.append(("raised", exc))

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(CASE_TIMEOUT_S)
    assert not thread.is_alive(), f"no answer within {CASE_TIMEOUT_S} s: a hang"
    kind, value = result[0]
    if kind == "raised":
        raise value
    return value


# ---------------------------------------------------------------------- valid shards


@pytest.mark.parametrize("seed", range(40))
def test_random_valid_shards_read_as_webdataset_reads_them(seed):
    rng = random.Random(seed)
    shard = random_shard(rng)
    reference, complete = webdataset_read(shard)
    assert complete
    assert bounded(lambda: our_read(shard, None)) == reference
    index = index_document(len(shard), tarfile_index(shard))
    assert bounded(lambda: our_read(shard, index)) == reference


# ---------------------------------------------------------------------- corruptions


def header_offsets(shard: bytes) -> list[int]:
    """Where each header block of the shard is, extended headers included."""
    offsets = []
    with tarfile.open(fileobj=io.BytesIO(shard)) as tar:
        for info in tar.getmembers():
            offsets.extend(range(info.offset, info.offset_data, BLOCK))
    return offsets


def data_ranges(shard: bytes) -> list[tuple[int, int]]:
    with tarfile.open(fileobj=io.BytesIO(shard)) as tar:
        return [(i.offset_data, i.size) for i in tar.getmembers() if i.isreg() and i.size]


def corrupt_shard(rng: random.Random, shard: bytes) -> tuple[str, bytes]:
    data = bytearray(shard)
    kind = rng.choice(["header", "header", "data", "anywhere", "truncate", "bogus", "pax"])
    if kind == "header":
        at = rng.choice(header_offsets(shard))
        for _ in range(rng.randrange(1, 4)):
            data[at + rng.randrange(BLOCK)] ^= 1 << rng.randrange(8)
    elif kind == "data" and data_ranges(shard):
        start, size = rng.choice(data_ranges(shard))
        data[start + rng.randrange(size)] ^= 0xFF
    elif kind == "truncate":
        cut = rng.choice([rng.randrange(len(shard)), rng.randrange(len(shard) // BLOCK) * BLOCK])
        del data[cut:]
    elif kind == "bogus":
        at = rng.choice(header_offsets(shard))
        size = rng.choice([0, 1, 512, 10**4, 10**9, len(shard)])
        kind_byte = rng.choice([b"0", b"5", b"x", b"L", b"g", b"S", b"K", b"1", b"V"])
        fields = {} if rng.random() < 0.7 else {"size_field": b"%011d\0" % rng.randrange(10**9)}
        name = rng.choice(["a.jpg", "k0.cls", "__meta__", "x" * 99, "d/"])
        data[at : at + BLOCK] = header(name, size, kind_byte, **fields)
    elif kind == "pax":
        records = rng.choice(
            [b"0 path=a.jpg\n", b"5 x=\n", b"11path=a.b\n", b"9 \xff\xff=ab\n", b"999 a=b\n"]
        )
        at = rng.choice(header_offsets(shard))
        data[at : at + 2 * BLOCK] = header("././@PaxHeader", len(records), b"x") + pad(records)
    else:
        data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
    return kind, bytes(data)


def corrupt_index(rng: random.Random, members: list[list[Any]], size: int) -> list[list[Any]]:
    members = [list(m) for m in members]
    if not members:
        return [["k.jpg", 0, 512, 1]]
    j = rng.randrange(len(members))
    kind = rng.randrange(9)
    if kind == 0:
        del members[j]
    elif kind == 1:
        members.insert(rng.randrange(len(members) + 1), list(members[j]))
    elif kind == 2:
        members[j][1] += BLOCK * rng.choice([-2, -1, 1, 2])
        members[j][2] += BLOCK * rng.choice([0, 1])
    elif kind == 3:
        members[j][3] = rng.choice([0, members[j][3] + 1, max(0, members[j][3] - 1), -1])
    elif kind == 4:
        other = rng.randrange(len(members))
        members[j][0], members[other][0] = members[other][0], members[j][0]
    elif kind == 5:  # point at any block, as if a member's data held a tar
        at = rng.randrange(max(1, size // BLOCK)) * BLOCK
        members[j][1:3] = [at, at + BLOCK]
    elif kind == 6:
        members[j][rng.randrange(1, 4)] = rng.choice([-(2**70), 2**70, -1, 0.5])
    elif kind == 7:
        members.append(["zz.jpg", size, size + BLOCK, 1])
    else:
        members[j][0] = members[j][0].rsplit(".", 1)[0] + ".other"
    return members


def check_against_webdataset(
    ours: list[Sample | ShardError] | ShardError,
    corrupted: bytes,
    original: list[Sample],
    indexed: bool,
) -> None:
    reference, complete = webdataset_read(corrupted)
    if isinstance(ours, ShardError):
        assert ours.url in (URL, URL + ".idx"), ours
        return
    for i, got in enumerate(ours):
        if isinstance(got, ShardError):
            assert got.url == URL, got
            assert "offset" in str(got), got
            continue
        # A sample webdataset reads from the corrupted shard at this place, or the one the
        # shard had there, its bytes intact (webdataset, streaming, fails on a truncated or
        # broken member before it yields the sample before it; with an index, the samples
        # after a broken header are read in place, their own headers checked).
        allowed = reference[i : i + 1] + original[i : i + 1]
        assert got in allowed, (i, got[0], [s[0] for s in allowed])
    if not indexed and complete:
        assert ours == reference


@pytest.mark.parametrize("seed", range(150))
def test_corrupted_shards_fail_clearly_or_read_as_webdataset_reads_them(seed):
    rng = random.Random(1000 + seed)
    shard = random_shard(rng)
    original, _ = webdataset_read(shard)
    _kind, corrupted = corrupt_shard(rng, shard)
    index = index_document(len(shard), tarfile_index(shard))  # of the shard before
    for given in (None, index):
        ours = bounded(lambda given=given: our_read(corrupted, given))
        check_against_webdataset(ours, corrupted, original, given is not None)


@pytest.mark.parametrize("seed", range(100))
def test_hostile_indexes_fail_clearly_or_give_the_shards_samples(seed):
    rng = random.Random(5000 + seed)
    shard = random_shard(rng)
    original, _ = webdataset_read(shard)
    members = corrupt_index(rng, tarfile_index(shard), len(shard))
    ours = bounded(lambda: our_read(shard, index_document(len(shard), members)))
    if isinstance(ours, ShardError):
        assert ours.url in (URL, URL + ".idx"), ours
        return
    # Whatever the index says, a sample is one the shard has, whole, at its place, unless
    # a sample before it in the shard failed (the walks prove a sample from the shard's
    # start on: a wrong index entry fails its own sample first).
    for i, got in enumerate(ours):
        if isinstance(got, ShardError):
            assert got.url == URL and "offset" in str(got), got
        elif not any(isinstance(before, ShardError) for before in ours[:i]):
            assert got == original[i], (i, got[0])


def test_member_names_that_are_not_utf8_read_as_webdataset_reads_them():
    # Latin-1 file names, as a tar made on an old system holds them (tarfile and webdataset
    # read them with surrogateescape); with an index written by our own ShardIndex too.
    from concurrent_loader.shards.index import ShardIndex
    from concurrent_loader.shards.tar import Member

    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for name, data in (("caf\udce9.jpg", b"1"), ("caf\udce9.cls", b"0"), ("b.jpg", b"2")):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    shard = out.getvalue()
    expected, clean = webdataset_read(shard)
    assert clean and [key for key, _ in expected] == ["caf\udce9", "b"]
    assert our_read(shard, None) == expected
    members = tuple(Member(*entry) for entry in tarfile_index(shard))
    index = ShardIndex(size=len(shard), members=members).to_json()
    assert our_read(shard, index) == expected
