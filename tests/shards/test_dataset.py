"""``ShardDataset`` on the in-memory store (our own logic only): indexing by scan, the
errors of ``decode`` and ``ImageSample``, and index checks."""

from __future__ import annotations

import io
import tarfile

import pytest

from concurrent_loader import (
    ConfigError,
    DecodeError,
    ImageSample,
    Reason,
    ShardDataset,
    ShardError,
)
from concurrent_loader.testing.memory import MemoryConfig


def tar_of(members: list[tuple[str, bytes]]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def dataset(members: list[tuple[str, bytes]], **kwargs) -> ShardDataset:
    return ShardDataset(MemoryConfig({"a.tar": tar_of(members)}, name="m"), **kwargs)


def test_a_shard_without_index_is_scanned():
    ds = dataset([("x.jpg", b"1"), ("x.cls", b"0"), ("y.jpg", b"22")])
    assert ds.shard_lengths == [2] and ds.shards == ["a.tar"]
    assert ds[1] == {"__key__": "y", "__url__": "memory://m/a.tar", "jpg": b"22"}
    assert ds[-2]["cls"] == b"0"


def test_image_sample_without_a_label_names_the_member_missing():
    ds = dataset([("x.jpg", b"not decoded before the check")], decode=ImageSample())
    with pytest.raises(
        ShardError, match=r"the sample has no a \.cls member; it has \[.jpg.\]"
    ) as raised:
        ds[0]
    assert raised.value.cause == Reason.MISSING_MEMBER
    assert raised.value.url == "memory://m/a.tar"
    assert "sample 'x', member 'x.jpg' at offset 0" in str(raised.value)


def test_image_sample_reads_every_image_extension_image_folder_reads_and_raw():
    from concurrent_loader import IMG_EXTENSIONS
    from concurrent_loader.shards.dataset import IMAGE_EXTENSIONS

    assert {ext.lstrip(".") for ext in IMG_EXTENSIONS} | {"raw"} == set(IMAGE_EXTENSIONS)


def test_errors_of_decode_name_the_shard_and_member():
    def decode(sample):
        raise ValueError("bad label")

    ds = dataset([("x.jpg", b"1"), ("y.jpg", b"2")], decode=decode)
    with pytest.raises(DecodeError, match="decode raised ValueError: bad label") as raised:
        ds[1]
    assert raised.value.url == "memory://m/a.tar"
    assert "sample 'y', member 'y.jpg' at offset 1024" in str(raised.value)
    assert isinstance(raised.value.__cause__, ValueError)


@pytest.mark.parametrize("index,error", [(2, IndexError), (-3, IndexError), ("0", TypeError)])
def test_bad_indices_are_refused(index, error):
    ds = dataset([("x.jpg", b"1"), ("y.jpg", b"2")])
    with pytest.raises(error):
        ds[index]


def test_a_root_without_shards_is_a_config_error():
    with pytest.raises(ConfigError, match=r"no tar shards \(\*\.tar\)"):
        ShardDataset(MemoryConfig({"x.jpg": b"1"}, name="m"))
