"""A dataset's key table is one segment that DataLoader workers of every start method map
(they receive its name, not its keys), released when the dataset closes or is collected."""

from __future__ import annotations

import gc
import io
import os
import pickle
from typing import Any

import pytest
import torch
from PIL import Image
from torch.utils.data import DataLoader, Dataset

from concurrent_loader import ConcurrentDataLoader, ImageFolder, ObjectDataset
from concurrent_loader.testing.memory import MemoryConfig

METHODS = ("fork", "spawn", "forkserver")


class ItemAndTable(Dataset[Any]):
    """Item ``i`` of ``dataset`` with the path of the key table the worker reads it from."""

    def __init__(self, dataset: ObjectDataset) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> tuple[bytes, str, int]:
        return self.dataset[index], self.dataset.keys.path, os.getpid()


@pytest.fixture
def local_objects(tmp_path):
    names = [f"class{i % 3}/item_{i:03d}.bin" for i in range(24)]
    for name in names:
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_bytes(name.encode())
    return tmp_path, sorted(names)


@pytest.mark.parametrize("method", METHODS)
def test_workers_of_every_start_method_read_the_one_shared_table(local_objects, method):
    root, names = local_objects
    with ObjectDataset(str(root)) as dataset:
        loader = DataLoader(
            ItemAndTable(dataset),
            batch_size=None,
            num_workers=2,
            multiprocessing_context=method,
        )
        items = list(loader)
        assert [data for data, _, _ in items] == [name.encode() for name in names]
        assert {path for _, path, _ in items} == {dataset.keys.path}
        assert os.getpid() not in {pid for _, _, pid in items}


def test_an_image_folders_classes_travel_in_the_table_to_spawned_workers():
    out = io.BytesIO()
    Image.new("RGB", (8, 8), (200, 10, 10)).save(out, format="PNG")
    objects = {f"{c}/{i}.png": out.getvalue() for c in ("cat", "dog") for i in range(3)}
    with ImageFolder(MemoryConfig(objects)) as dataset:
        loader = ConcurrentDataLoader(
            dataset, batch_size=2, num_workers=2, multiprocessing_context="spawn"
        )
        targets = torch.cat([batch[1] for batch in loader]).tolist()
        assert targets == dataset.targets.tolist() == [0, 0, 0, 1, 1, 1]


def test_a_pickled_dataset_carries_the_tables_name_not_its_keys(local_objects):
    root, names = local_objects
    keys = [f"{name}/{'x' * 200}" for name in names]
    with ObjectDataset(str(root), keys=keys) as dataset:
        assert len(pickle.dumps(dataset)) < sum(map(len, keys)) // 2


def test_the_table_is_gone_after_close_and_after_collection(local_objects):
    root, _ = local_objects
    dataset = ObjectDataset(str(root))
    path = dataset.keys.path
    dataset.close()
    assert not os.path.exists(path)
    assert dataset[0] == b"class0/item_000.bin"  # still usable in this process
    dataset.close()  # idempotent
    shared = ObjectDataset(str(root))
    second = ObjectDataset(str(root), keys=shared.keys)  # two datasets, one table
    path = shared.keys.path
    shared.close()
    assert os.path.exists(path)
    second.close()
    assert not os.path.exists(path)
    collected = ObjectDataset(str(root)).keys.path
    gc.collect()
    assert not os.path.exists(collected)


def test_index_errors_name_the_index_and_the_size(local_objects):
    root, names = local_objects
    with ObjectDataset(str(root)) as dataset:
        with pytest.raises(IndexError, match=f"index {len(names)} out of range for a dataset"):
            dataset[len(names)]
        assert dataset[-1] == names[-1].encode()
        with pytest.raises(TypeError):
            dataset["0"]  # type: ignore[index]


def test_an_image_folder_of_unsorted_keys_sorts_them():
    objects = {key: b"x" for key in ("dog/b.png", "cat/z.jpg", "cat/a.jpg", "notes.txt")}
    with ImageFolder(MemoryConfig(objects), keys=list(objects)) as dataset:
        assert list(dataset.keys) == ["cat/a.jpg", "cat/z.jpg", "dog/b.png"]
        assert dataset.targets.tolist() == [0, 0, 1] and dataset.classes == ["cat", "dog"]
        assert dataset.source.sizes is None


def test_an_image_folder_without_extensions_finds_no_images():
    from concurrent_loader.errors import ConfigError

    with pytest.raises(ConfigError, match="no images"):
        ImageFolder(MemoryConfig({"cat/a.jpg": b"x"}), keys=["cat/a.jpg"], extensions=())
