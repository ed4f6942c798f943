"""``concurrent-loader pack``: deterministic shards and indexes that ``webdataset`` reads as
the same samples, split at sample boundaries, to a directory or an S3 prefix."""

from __future__ import annotations

import hashlib
import json
import tarfile
from pathlib import Path

import pytest

from concurrent_loader import ConfigError, ShardDataset
from concurrent_loader.cli import main
from concurrent_loader.shards.pack import pack, parse_size
from concurrent_loader.stores import S3Config

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
        "concurrent-loader: error: bad size '12XB': expected a "
        "positive number of bytes like 256MB or 64MiB"
    ]
    assert not (tmp_path / "out").exists()


# ------------------------------------------------ what both readers read, and nothing else


def read_back(root: Path) -> dict[str, dict[str, bytes]]:
    """The samples of the pack in ``root`` as ShardDataset reads them, checked equal (keys,
    order, members, bytes) to what webdataset reads from the same shard files."""
    with ShardDataset(str(root)) as ds:
        ours = [ds[i] for i in range(len(ds))]
    theirs = webdataset_samples(sorted(root.glob("*.tar")))
    strip = [{k: v for k, v in s.items() if k != "__url__"} for s in ours]
    assert strip == [{k: v for k, v in s.items() if k != "__url__"} for s in theirs]
    keys = [s["__key__"] for s in ours]
    assert len(keys) == len(set(keys)), "a key read as two samples"
    return {s["__key__"]: {k: v for k, v in s.items() if not k.startswith("__")} for s in ours}


def write_files(root: Path, names: list[str]) -> dict[str, bytes]:
    files = {}
    for name in names:
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(name.encode() * 3)
        files[name] = name.encode() * 3
    return files


def test_packing_over_an_earlier_pack_is_refused_and_leaves_it_as_it_was(tmp_path):
    write_samples(tmp_path / "big", n=29, seed=1)
    write_samples(tmp_path / "small", n=20, seed=2)
    pack(str(tmp_path / "big"), str(tmp_path / "out"), shard_size=20_000)
    before = digest_tree(tmp_path / "out")
    refused = r"holds a pack \(12 files: shard-000000.tar; .*--overwrite"
    with pytest.raises(ConfigError, match=refused):
        pack(str(tmp_path / "small"), str(tmp_path / "out"), shard_size=40_000)
    assert digest_tree(tmp_path / "out") == before


def test_overwrite_removes_exactly_the_earlier_packs_files(tmp_path):
    write_samples(tmp_path / "big", n=29, seed=1)
    small = write_samples(tmp_path / "small", n=20, seed=2)
    earlier = pack(str(tmp_path / "big"), str(tmp_path / "out"), shard_size=20_000)
    (tmp_path / "out" / "NOTES.md").write_text("kept")
    (tmp_path / "out" / "shard-7.tar.idx.bak").write_text("kept: not the packer's name")
    result = pack(str(tmp_path / "small"), str(tmp_path / "out"), overwrite=True)
    assert result.shards == ["shard-000000.tar"]
    assert len(earlier.shards) > 1
    assert sorted(result.removed) == sorted(
        [name for shard in earlier.shards for name in (shard, shard + ".idx")]
    )
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        "NOTES.md",
        "shard-000000.tar",
        "shard-000000.tar.idx",
        "shard-7.tar.idx.bak",
    ]
    assert read_back(tmp_path / "out") == small


def test_overwrite_of_an_s3_prefix_removes_only_the_earlier_pack(
    tmp_path, s3_server, s3_bucket, s3_env
):
    write_samples(tmp_path / "big", n=29, seed=1)
    small = write_samples(tmp_path / "small", n=20, seed=2)
    dest = f"s3://{s3_bucket}/overwritten"
    earlier = pack(str(tmp_path / "big"), dest, shard_size=20_000)
    s3_server.put_object(s3_bucket, "overwritten/NOTES.md", b"kept")
    s3_server.put_object(s3_bucket, "overwritten-too/shard-000009.tar.idx", b"another prefix")
    with pytest.raises(ConfigError, match="already holds a pack"):
        pack(str(tmp_path / "small"), dest)
    result = pack(str(tmp_path / "small"), dest, overwrite=True)
    assert len(earlier.shards) > 1 and result.shards == ["shard-000000.tar"]
    assert s3_server.get_object(s3_bucket, "overwritten/NOTES.md") == b"kept"
    assert s3_server.get_object(s3_bucket, "overwritten-too/shard-000009.tar.idx")
    with ShardDataset(dest + "/") as ds:
        assert ds.shards == ["shard-000000.tar"]
        samples = [ds[i] for i in range(len(ds))]
    assert {s["__key__"]: {"bin": s["bin"], "txt": s["txt"]} for s in samples} == small


def test_other_tar_files_in_dest_are_refused_even_with_overwrite(tmp_path):
    write_samples(tmp_path / "objects", n=5)
    (tmp_path / "out" / "old").mkdir(parents=True)
    (tmp_path / "out" / "old" / "shard-000000.tar").write_bytes(b"x" * 1024)
    with pytest.raises(ConfigError, match=r"1 tar files the packer did not write \(old/shard"):
        pack(str(tmp_path / "objects"), str(tmp_path / "out"), overwrite=True)
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["old"]


def test_a_dest_inside_the_source_is_refused(tmp_path):
    write_samples(tmp_path / "objects", n=5)
    with pytest.raises(ConfigError, match="is inside SRC"):
        pack(str(tmp_path / "objects"), str(tmp_path / "objects" / "shards"))
    with pytest.raises(ConfigError, match="is inside SRC"):
        pack(str(tmp_path / "objects"), str(tmp_path / "objects"), overwrite=True)
    assert sorted(p.name for p in (tmp_path / "objects").iterdir())[-1] == "s0004.txt"


def test_an_s3_dest_inside_the_s3_source_is_refused(tmp_path, s3_server, s3_bucket, s3_env):
    write_samples(tmp_path / "objects", n=5)
    s3_server.upload_dir(tmp_path / "objects", s3_bucket, prefix="inside/")
    with pytest.raises(ConfigError, match="is inside SRC"):
        pack(f"s3://{s3_bucket}/inside", f"s3://{s3_bucket}/inside/shards")
    client = s3_server.client()
    try:
        listed = client.list_objects_v2(Bucket=s3_bucket, Prefix="inside/")["Contents"]
    finally:
        client.close()
    assert len(listed) == 10  # the source's objects, and nothing written


@pytest.mark.parametrize(
    "names,image_folder,colliding",
    [
        (["a.JPG", "a.jpg", "b.jpg"], False, ["a.JPG", "a.jpg"]),
        (["a.seg.PNG", "a.seg.png", "a.txt"], False, ["a.seg.PNG", "a.seg.png"]),
        (["a.__key__", "a.txt"], False, ["a.__key__"]),
        (["c/a.b.jpg", "c/a_b.jpg", "c/z.jpg"], True, ["c/a.b.jpg", "c/a_b.jpg"]),
        (["c/x.jpg", "c/x.png", "d/x.png"], True, ["c/x.jpg", "c/x.png"]),
        (["c/a.JPG", "c/a.jpg"], True, ["c/a.JPG", "c/a.jpg"]),
    ],
)
def test_objects_that_map_to_one_member_are_refused_before_writing(
    tmp_path, names, image_folder, colliding
):
    write_files(tmp_path / "src", names)
    with pytest.raises(ConfigError, match="map to one member of one sample") as caught:
        pack(str(tmp_path / "src"), str(tmp_path / "out"), image_folder=image_folder)
    message = str(caught.value)
    assert " and ".join(str(tmp_path / "src" / name) for name in colliding) in message
    assert not (tmp_path / "out").exists()


def test_an_image_folder_the_readers_would_skip_is_refused(tmp_path):
    write_files(tmp_path / "src", ["__meta__/x.jpg", "cat/y.jpg"])
    with pytest.raises(ConfigError, match=r"would not read back.*__meta__/x.jpg"):
        pack(str(tmp_path / "src"), str(tmp_path / "out"), image_folder=True)
    assert not (tmp_path / "out").exists()


def test_objects_no_reader_groups_are_skipped_and_not_counted(tmp_path, capsys):
    names = ["a.jpg", "a.txt", "b.jpg", "README", "LICENSE", ".DS_Store", "d/.hidden"]
    names += ["d/e.jpg", "__meta__/x.json", "dots.in.name.txt"]
    files = write_files(tmp_path / "src", names)
    code = main(["pack", str(tmp_path / "src"), str(tmp_path / "out"), "--no-progress"])
    assert code == 0
    err = capsys.readouterr().err
    assert "skipped 5 objects that no reader makes part of a sample" in err
    assert ".DS_Store; LICENSE; README; __meta__/x.json; d/.hidden" in err
    assert "wrote 4 samples in 1 shards" in err
    read = read_back(tmp_path / "out")
    assert read == {
        "a": {"jpg": files["a.jpg"], "txt": files["a.txt"]},
        "b": {"jpg": files["b.jpg"]},
        "d/e": {"jpg": files["d/e.jpg"]},
        "dots": {"in.name.txt": files["dots.in.name.txt"]},
    }
    result = pack(str(tmp_path / "src"), str(tmp_path / "again"))
    assert result.samples == len(read) and len(result.skipped) == 5


def test_a_source_with_only_unreadable_objects_is_refused(tmp_path):
    write_files(tmp_path / "src", ["README", ".env"])
    with pytest.raises(ConfigError, match="nothing to pack under .*none of its 2 objects"):
        pack(str(tmp_path / "src"), str(tmp_path / "out"))
    assert not (tmp_path / "out").exists()


def test_a_key_whose_members_do_not_sort_together_is_still_one_sample(tmp_path):
    # By name "a.zz/b.jpg" sorts between "a.jpg" and "a.zzz", which are both sample "a".
    files = write_files(tmp_path / "src", ["a.jpg", "a.zz/b.jpg", "a.zzz"])
    result = pack(str(tmp_path / "src"), str(tmp_path / "out"))
    assert result.samples == 2
    assert read_back(tmp_path / "out") == {
        "a": {"jpg": files["a.jpg"], "zzz": files["a.zzz"]},
        "a.zz/b": {"jpg": files["a.zz/b.jpg"]},
    }


def test_store_options_apply_to_the_side_on_s3(
    tmp_path, capsys, s3_server, s3_bucket, aws_env, monkeypatch
):
    aws_env(s3_server)
    monkeypatch.delenv("AWS_ENDPOINT_URL")  # the endpoint comes from --endpoint-url alone
    expected = write_samples(tmp_path / "objects", n=12, seed=4)
    s3_server.upload_dir(tmp_path / "objects", s3_bucket, prefix="options-raw/")
    options = ["--endpoint-url", s3_server.endpoint_url, "--no-progress"]
    for src in (str(tmp_path / "objects"), f"s3://{s3_bucket}/options-raw"):
        dest = f"s3://{s3_bucket}/options-{len(src)}"
        assert main(["pack", src, dest, *options]) == 0, capsys.readouterr().err
        with ShardDataset(S3Config.from_url(dest, endpoint_url=s3_server.endpoint_url)) as ds:
            samples = [ds[i] for i in range(len(ds))]
        assert {s["__key__"]: {"bin": s["bin"], "txt": s["txt"]} for s in samples} == expected
    capsys.readouterr()
    assert main(["pack", str(tmp_path / "objects"), str(tmp_path / "out"), *options]) == 1
    assert "endpoint_url apply to an s3:// SRC or DEST; neither" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_the_pack_command_refuses_an_earlier_pack_in_one_line_and_overwrites_it(tmp_path, capsys):
    write_samples(tmp_path / "big", n=29, seed=1)
    small = write_samples(tmp_path / "small", n=20, seed=2)
    out = str(tmp_path / "out")
    assert main(["pack", str(tmp_path / "big"), out, "--shard-size", "20KB"]) == 0
    capsys.readouterr()
    assert main(["pack", str(tmp_path / "small"), out, "--no-progress"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "already holds a pack (12 files: " in err[0], err
    assert main(["pack", str(tmp_path / "small"), out, "--overwrite", "--no-progress"]) == 0
    err = capsys.readouterr().err
    assert "removed the earlier pack's 12 files" in err and "wrote 20 samples in 1 shards" in err
    assert read_back(tmp_path / "out") == small
