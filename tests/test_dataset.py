"""ObjectDataset and ImageFolder over the in-memory store, as plain map-style datasets."""

from __future__ import annotations

import io
import pickle
from collections.abc import Iterator

import numpy as np
import pytest
import torch
from PIL import Image

from concurrent_loader import (
    ConfigError,
    FetchConfig,
    ImageFolder,
    ObjectDataset,
    ObjectNotFound,
    PartsConfig,
    Reason,
)
from concurrent_loader.stores import S3Config
from concurrent_loader.testing.memory import MemoryConfig
from tests import helpers as shared


@pytest.fixture
def helpers() -> type[shared.Helpers]:
    return shared.Helpers


@pytest.fixture(autouse=True)
def no_loader_threads_left() -> Iterator[None]:
    yield from shared.threads_checked()


def test_keys_and_sizes_come_from_the_listing_sorted(helpers):
    objects = {"b.bin": b"22", "a.bin": b"1", "c/d.bin": b"333"}
    dataset = ObjectDataset(MemoryConfig(objects))
    assert list(dataset.keys) == ["a.bin", "b.bin", "c/d.bin"]
    assert dataset.source.sizes.tolist() == [1, 2, 3]
    assert len(dataset) == 3
    assert dataset.url_for(2) == "memory://test/c/d.bin"
    assert "3 objects" in repr(dataset)


def test_an_empty_store_is_a_config_error():
    with pytest.raises(ConfigError) as caught:
        ObjectDataset(MemoryConfig({}))
    assert caught.value.cause is Reason.EMPTY_PREFIX


@pytest.mark.parametrize("remote", [True, False])
def test_getitem_reads_one_object(helpers, remote):
    store = MemoryConfig(helpers.numbered_objects(10), remote=remote)
    with ObjectDataset(store, decode=helpers.index_of) as dataset:
        assert dataset[3] == 3
        assert dataset[-1] == 9
        assert dataset[np.int64(4)] == 4
    with ObjectDataset(store) as raw:
        assert raw[2] == helpers.body_for(2)


def test_bad_indices_are_refused(helpers):
    with ObjectDataset(MemoryConfig(helpers.numbered_objects(3))) as dataset:
        with pytest.raises(IndexError):
            dataset[3]
        with pytest.raises(IndexError):
            dataset[-4]
        with pytest.raises(TypeError):
            dataset["0"]


def test_getitems_fetches_a_batch_concurrently_in_order(helpers):
    store = MemoryConfig(helpers.numbered_objects(20), script=helpers.jitter(3, 0.003))
    with ObjectDataset(store, decode=helpers.index_of) as dataset:
        indices = [7, 2, 19, 2, 0, 11]
        assert dataset.__getitems__(indices) == indices
    assert store.stats.max_in_flight > 1


def test_a_missing_object_names_itself(helpers):
    objects = helpers.numbered_objects(3)
    dataset = ObjectDataset(MemoryConfig(objects), [*objects, "gone.bin"])
    with dataset, pytest.raises(ObjectNotFound) as caught:
        dataset[3]
    assert caught.value.url == "memory://test/gone.bin"


def test_a_dataset_pickles_without_anything_open(helpers):
    store = MemoryConfig(helpers.numbered_objects(5))
    with ObjectDataset(store, decode=None) as dataset:
        assert dataset[0] == helpers.body_for(0)  # a runtime is leased now
        copy = pickle.loads(pickle.dumps(dataset))
    with copy:
        assert list(copy.keys) == list(dataset.keys)
        assert copy[4] == helpers.body_for(4)


def image(color: tuple[int, int, int], fmt: str = "JPEG") -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (24, 16), color).save(out, format=fmt)
    return out.getvalue()


def test_image_folder_over_a_store(helpers):
    objects = {
        "dog/b.png": image((0, 0, 255), "PNG"),
        "cat/a.jpg": image((255, 0, 0)),
        "dog/c.JPG": image((0, 255, 0)),
        "readme.txt": b"not an image",
        "top.jpg": image((9, 9, 9)),  # not in a class folder
        "cat/notes.txt": b"skipped",
    }
    with ImageFolder(MemoryConfig(objects)) as dataset:
        assert dataset.classes == ["cat", "dog"]
        assert dataset.class_to_idx == {"cat": 0, "dog": 1}
        assert list(dataset.keys) == ["cat/a.jpg", "dog/b.png", "dog/c.JPG"]
        assert dataset.targets.tolist() == [0, 1, 1]
        assert dataset.samples[1] == ("memory://test/dog/b.png", 1)
        assert dataset.source.sizes.tolist() == [len(objects[k]) for k in dataset.keys]
        picture, target = dataset[1]
        assert target == 1
        assert picture.dtype == torch.uint8 and tuple(picture.shape) == (3, 16, 24)
        assert picture[2].float().mean() > 200  # blue


def test_image_folder_without_images_is_a_config_error():
    with pytest.raises(ConfigError) as caught:
        ImageFolder(MemoryConfig({"readme.txt": b"x", "top.jpg": b"y"}))
    assert caught.value.cause is Reason.EMPTY_PREFIX


def test_items_of_a_local_root_share_one_open_store_per_process_until_close(tmp_path):
    for name in ("a.bin", "b.bin"):
        (tmp_path / name).write_bytes(name.encode())
    dataset = ObjectDataset(str(tmp_path))
    assert [dataset[0], dataset[1]] == [b"a.bin", b"b.bin"]
    opened = dataset._blocking_store()
    assert dataset[1] == b"b.bin" and dataset._blocking_store() is opened
    dataset.close()
    assert dataset[0] == b"a.bin" and dataset._blocking_store() is not opened
    copy = pickle.loads(pickle.dumps(dataset))  # a worker's copy opens its own
    assert copy[0] == b"a.bin" and copy._blocking_store() is not dataset._blocking_store()


def test_how_bytes_are_fetched_is_the_datasets():
    config = FetchConfig(max_inflight_requests=3)
    parts = PartsConfig(part_size=1024, parts_in_flight=2)
    dataset = ObjectDataset(MemoryConfig({"a.bin": b"a"}), fetch_config=config, parts=parts)
    assert (dataset.fetch_config, dataset.parts) == (config, parts)
    assert ObjectDataset(MemoryConfig({"a.bin": b"a"})).parts == PartsConfig()
    with pytest.raises(ConfigError):
        ObjectDataset(MemoryConfig({"a.bin": b"a"}), parts=1024)  # type: ignore[arg-type]


def test_a_backends_options_are_its_config_given_as_the_root(tmp_path):
    s3 = S3Config.from_url("s3://bucket/p/", anonymous=True, verify_checksums=False)
    assert s3.verify_checksums is False
    dataset = ObjectDataset(MemoryConfig({"a.bin": b"a"}))
    assert isinstance(dataset.store, MemoryConfig)
    # No backend option is a dataset argument; an S3 option for a local root is refused.
    with pytest.raises(TypeError):
        ObjectDataset(tmp_path, endpoint_url="http://127.0.0.1:9000")  # type: ignore[call-arg]
    with pytest.raises(ConfigError, match="S3 options apply to an s3://"):
        ObjectDataset(S3Config.from_url(str(tmp_path), region="eu-west-1"))


def test_parts_must_be_a_parts_config():
    with pytest.raises(ConfigError, match="parts must be a PartsConfig, got int"):
        ObjectDataset(MemoryConfig({"a.bin": b"x"}), parts=8)  # type: ignore[arg-type]
