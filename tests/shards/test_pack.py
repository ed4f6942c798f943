"""``concurrent-loader pack``: deterministic shards and indexes that ``webdataset`` reads as
the same samples, split at sample boundaries, to a directory or an S3 prefix."""

from __future__ import annotations

import hashlib
import json
import tarfile

import pytest

from concurrent_loader import ConfigError, ShardDataset
from concurrent_loader.cli import main
from concurrent_loader.shards.pack import pack, parse_size

from .conftest import SHARD_SIZE, webdataset_samples, write_samples

pytest.importorskip("webdataset", reason="the webdataset library is in requirements-dev.txt")


def digest_tree(root) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.iterdir())}


def test_packing_twice_gives_the_same_bytes(tmp_path, packed):
    result = pack(str(packed.source), str(tmp_path / "again"), shard_size=SHARD_SIZE)
    assert result.shards == packed.shards
    assert digest_tree(tmp_path / "again") == digest_tree(packed.local)


def test_headers_are_fixed_and_shards_split_at_sample_boundaries(packed):
    assert len(packed.shards) >= 3
    seen: list[str] = []
    for name in packed.shards:
        path = packed.local / name
        assert path.stat().st_size <= SHARD_SIZE + 10240  # + the end blocks and record padding
        with tarfile.open(path) as tar:
            infos = tar.getmembers()
        assert {(i.mtime, i.uid, i.gid, i.uname, i.gname, i.mode) for i in infos} == {
            (0, 0, 0, "", "", 0o444)
        }
        keys = [i.name.split(".")[0] for i in infos]
        assert keys[0] not in seen  # no sample continues from the previous shard
        seen.extend(dict.fromkeys(keys))
    assert seen == packed.order


def test_webdataset_reads_the_packed_samples(packed):
    samples = webdataset_samples([packed.local / s for s in packed.shards])
    assert [s["__key__"] for s in samples] == packed.order
    for sample in samples:
        assert {"bin": sample["bin"], "txt": sample["txt"]} == packed.expected[sample["__key__"]]


def test_the_index_lists_each_member_where_tarfile_finds_it(packed):
    name = packed.shards[1]
    document = json.loads((packed.local / (name + ".idx")).read_bytes())
    with tarfile.open(packed.local / name) as tar:
        infos = tar.getmembers()
    assert document["size"] == (packed.local / name).stat().st_size
    assert document["members"] == [[i.name, i.offset, i.offset_data, i.size] for i in infos]


def test_image_folder_input_gets_class_members(tmp_path, image_folder):
    root, files = image_folder
    code = main(["pack", str(root), str(tmp_path / "out"), "--image-folder", "--no-progress"])
    assert code == 0
    shards = sorted((tmp_path / "out").glob("*.tar"))
    samples = webdataset_samples(shards)
    classes = sorted({name for _, name, _ in files})
    expected = {key.rsplit(".", 1)[0]: (name, digest) for key, name, digest in files}
    assert len(samples) == len(files)
    for sample in samples:
        name, digest = expected[sample["__key__"]]
        assert hashlib.sha256(sample["jpg"]).hexdigest() == digest
        assert int(sample["cls"]) == classes.index(name)


def test_pack_to_an_s3_prefix_reads_back(tmp_path, s3_server, s3_bucket, s3_env):
    expected = write_samples(tmp_path / "objects", n=30, seed=9)
    result = pack(str(tmp_path / "objects"), f"s3://{s3_bucket}/packed-up", shard_size=40_000)
    assert len(result.shards) > 1
    with ShardDataset(f"s3://{s3_bucket}/packed-up/") as ds:
        assert ds.shards == result.shards
        samples = [ds[i] for i in range(len(ds))]
    assert {s["__key__"]: {"bin": s["bin"], "txt": s["txt"]} for s in samples} == expected


@pytest.mark.parametrize(
    "text,size", [("256MB", 256_000_000), ("64MiB", 64 << 20), ("1000", 1000), ("1.5KB", 1500)]
)
def test_shard_sizes_parse(text, size):
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["", "0", "12XB", "-5MB", "MB"])
def test_bad_shard_sizes_are_refused(text):
    with pytest.raises(ConfigError, match="bad size"):
        parse_size(text)


def test_packing_an_s3_prefix_gives_the_bytes_of_packing_the_same_files_locally(
    tmp_path, image_dataset, s3_env
):
    from_s3 = pack(image_dataset.s3_url, str(tmp_path / "s3"), image_folder=True)
    local = pack(str(image_dataset.local_root), str(tmp_path / "local"), image_folder=True)
    assert from_s3 == local
    assert digest_tree(tmp_path / "s3") == digest_tree(tmp_path / "local")


def test_the_pack_command_reports_a_bad_size_in_one_line(tmp_path, capsys, packed):
    code = main(["pack", str(packed.source), str(tmp_path / "out"), "--shard-size", "12XB"])
    assert code == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "concurrent-loader: error: InvalidArgument - bad size '12XB': expected a "
        "positive number of bytes like 256MB or 64MiB"
    ]
    assert not (tmp_path / "out").exists()
