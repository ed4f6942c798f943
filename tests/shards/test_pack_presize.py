"""``concurrent-loader pack --image-folder --resize S``: shards of pre-sized images, read by
``webdataset`` and by ShardDataset, with the original sizes in the index."""

from __future__ import annotations

import hashlib
import io
import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from concurrent_loader import ConfigError, ShardDataset
from concurrent_loader.cli import main
from concurrent_loader.decode import Presize, read_raw
from concurrent_loader.errors import DecodeError, ShardError
from concurrent_loader.shards.dataset import ImageSample
from concurrent_loader.shards.index import ShardIndex
from concurrent_loader.shards.pack import pack

from .conftest import webdataset_samples

pytest.importorskip("webdataset", reason="the webdataset library is in requirements-dev.txt")

SHORT = 48
#: file -> (stored size, upright size); "rot" is stored on its side with EXIF orientation 6
IMAGES = {
    "cat/a.jpg": ((160, 120), (160, 120)),
    "cat/b.jpg": ((90, 200), (90, 200)),
    "cat/c.png": ((100, 80), (100, 80)),  # RGBA PNG
    "dog/rot.jpg": ((60, 130), (130, 60)),
    "dog/small.jpg": ((40, 30), (40, 30)),  # never upscaled
    "dog/z.v2.jpeg": ((128, 96), (128, 96)),  # sample key dog/z_v2
}


def _write_folder(root: Path) -> None:
    for i, (name, (size, _)) in enumerate(sorted(IMAGES.items())):
        w, h = size
        rng = np.random.default_rng(i)
        pixels = rng.integers(0, 255, (h, w, 3), dtype=np.uint8)
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if name.endswith(".png"):
            alpha = np.full((h, w, 1), 128, np.uint8)
            Image.fromarray(np.concatenate([pixels, alpha], 2)).save(path, "PNG")
        elif "rot" in name:
            exif = Image.Exif()
            exif[0x0112] = 6
            Image.fromarray(pixels).save(path, "JPEG", quality=90, exif=exif.tobytes())
        else:
            Image.fromarray(pixels).save(path, "JPEG", quality=90)


def _digest(root: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.iterdir())}


def _expected(size: tuple[int, int]) -> tuple[int, int]:
    return Presize(SHORT).target(*size)


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("presize") / "train"
    _write_folder(root)
    return root


@pytest.fixture(scope="module")
def packs(folder: Path) -> dict[str, Path]:
    out = folder.parent
    pack(str(folder), str(out / "plain"), image_folder=True)
    pack(str(folder), str(out / "jpeg"), image_folder=True, presize=Presize(SHORT), processes=2)
    raw = Presize(SHORT, "raw")
    pack(str(folder), str(out / "raw"), image_folder=True, presize=raw, processes=1)
    return {name: out / name for name in ("plain", "jpeg", "raw")}


def _samples(root: Path) -> list[dict]:
    return webdataset_samples(sorted(root.glob("*.tar")))


def test_keys_and_labels_are_those_of_the_plain_pack(packs):
    plain = _samples(packs["plain"])
    assert [s["__key__"] for s in plain] == sorted(
        n.rsplit(".", 1)[0].replace(".", "_") for n in IMAGES
    )
    for form, extension in (("jpeg", "jpg"), ("raw", "raw")):
        samples = _samples(packs[form])
        assert [s["__key__"] for s in samples] == [s["__key__"] for s in plain]
        assert [s["cls"] for s in samples] == [s["cls"] for s in plain] != []
        assert all(set(s) - {"__key__", "__url__"} == {extension, "cls"} for s in samples)


def test_webdataset_decodes_the_presized_jpegs_at_their_size(packs):
    from webdataset.autodecode import Decoder, imagehandler

    decode = Decoder([imagehandler("pil")])
    upright = {n.rsplit(".", 1)[0].replace(".", "_"): up for n, (_, up) in IMAGES.items()}
    for sample in _samples(packs["jpeg"]):
        image = decode(sample)["jpg"]
        assert image.size == _expected(upright[sample["__key__"]]), sample["__key__"]
        assert Image.open(io.BytesIO(sample["jpg"])).format == "JPEG"


def test_raw_members_hold_the_pixels_upright(packs):
    upright = {n.rsplit(".", 1)[0].replace(".", "_"): up for n, (_, up) in IMAGES.items()}
    for sample in _samples(packs["raw"]):
        w, h = _expected(upright[sample["__key__"]])
        assert read_raw(sample["raw"]).shape == (h, w, 3)


def test_the_index_records_the_setting_and_each_original_size(packs):
    for form, extension in (("jpeg", "jpg"), ("raw", "raw")):
        [idx] = sorted(packs[form].glob("*.idx"))
        index = ShardIndex.from_json(idx.read_bytes(), str(idx))
        assert index.presize == Presize(SHORT, form).identity
        expected = {
            f"{n.rsplit('.', 1)[0].replace('.', '_')}.{extension}": up
            for n, (_, up) in IMAGES.items()
        }
        assert dict(index.original_sizes) == expected
        assert index.original_sizes.get("dog/rot." + extension) == (130, 60)
        assert index.original_sizes.get("dog/rot.cls") is None
    [plain] = sorted(packs["plain"].glob("*.idx"))
    document = json.loads(plain.read_bytes())
    assert "presize" not in document and "original_sizes" not in document


def test_packing_again_gives_the_same_bytes_whatever_the_processes(folder, packs, tmp_path):
    again = pack(
        str(folder), str(tmp_path / "one"), image_folder=True, presize=Presize(SHORT), processes=1
    )
    assert again.samples == len(IMAGES)
    assert _digest(tmp_path / "one") == _digest(packs["jpeg"])


def test_shards_split_on_the_presized_sizes(folder, tmp_path):
    result = pack(
        str(folder),
        str(tmp_path / "out"),
        image_folder=True,
        presize=Presize(SHORT, "raw"),
        shard_size=12_000,
        processes=1,
    )
    assert len(result.shards) > 1 and result.samples == len(IMAGES)
    keys = [s["__key__"] for s in _samples(tmp_path / "out")]
    assert len(keys) == len(set(keys)) == len(IMAGES)
    for shard in (tmp_path / "out").glob("*.tar"):
        assert shard.stat().st_size <= 12_000 + 10240 or len(webdataset_samples([shard])) == 1


@pytest.mark.parametrize("form", ["jpeg", "raw"])
def test_shard_dataset_reads_presized_shards(packs, form):
    dataset = ShardDataset(str(packs[form]), decode=ImageSample(32))
    try:
        items = [dataset[i] for i in range(len(dataset))]
    finally:
        dataset.close()
    assert len(items) == len(IMAGES)
    assert all(tuple(image.shape) == (3, 32, 32) for image, _ in items)
    assert sorted({label for _, label in items}) == [0, 1]


def test_the_command_packs_presized_and_refuses_options_without_resize(folder, tmp_path, capsys):
    out = str(tmp_path / "cli")
    argv = ["pack", str(folder), out, "--image-folder", "--no-progress", "--resize", str(SHORT)]
    assert main([*argv, "--format", "raw", "--processes", "1"]) == 0, capsys.readouterr().err
    assert len(list(Path(out).glob("*.tar"))) == 1
    base = ["pack", str(folder), str(tmp_path / "x"), "--no-progress"]
    for extra in (["--quality", "80"], ["--format", "raw"], ["--image-folder", "--processes", "2"]):
        assert main([*base, *extra]) == 1
        assert "apply to --resize" in capsys.readouterr().err
    assert main([*base, "--resize", "64"]) == 1
    assert "needs --image-folder" in capsys.readouterr().err
    assert main([*base, "--image-folder", "--resize", "0"]) == 1
    assert "short_side must be an int >= 1" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_an_image_that_cannot_be_decoded_ends_the_pack_naming_it(folder, tmp_path):
    src = tmp_path / "src"
    _write_folder(src)
    (src / "dog" / "broken.jpg").write_bytes((src / "cat" / "a.jpg").read_bytes()[:300])
    with pytest.raises(DecodeError) as info:
        pack(
            str(src), str(tmp_path / "out"), image_folder=True, presize=Presize(SHORT), processes=1
        )
    assert info.value.url is not None and info.value.url.endswith("dog/broken.jpg")
    with pytest.raises(ConfigError):
        pack(str(src), str(tmp_path / "o2"), presize=Presize(SHORT))


# --------------------------------------------------------------- the index's new keys


def _index(**extra: object) -> bytes:
    document = {
        "format": "concurrent-loader/tar-index",
        "version": 1,
        "size": 2048,
        "members": [["a.jpg", 0, 512, 100]],
        **extra,
    }
    return json.dumps(document).encode()


def test_an_index_reads_with_or_without_original_sizes():
    assert ShardIndex.from_json(_index(), "x.idx").original_sizes == {}
    index = ShardIndex.from_json(
        _index(presize="presize-v1:raw:8", original_sizes={"a.jpg": [10, 20]}), "x.idx"
    )
    assert index.original_sizes.get("a.jpg") == (10, 20) and index.presize == "presize-v1:raw:8"
    assert ShardIndex.from_json(index.to_json(), "x.idx") == index


@pytest.mark.parametrize(
    "extra",
    [
        {"original_sizes": [[10, 20]]},
        {"original_sizes": {"a.jpg": [10]}},
        {"original_sizes": {"a.jpg": [0, 20]}},
        {"original_sizes": {"a.jpg": [10, True]}},
        {"original_sizes": {"b.jpg": [10, 20]}},  # not a member of the index
        {"presize": 3},
    ],
)
def test_bad_original_sizes_are_a_shard_error(extra):
    with pytest.raises(ShardError) as info:
        ShardIndex.from_json(_index(**extra), "s3://b/x.idx")
    assert info.value.url == "s3://b/x.idx" and info.value.cause == "IndexMismatch"
