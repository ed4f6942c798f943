"""End-to-end: ConcurrentDataLoader over the real local S3 server (and the same data on disk).

Every test checks sample identity (content and label against the source files), not just
shapes, because a loader that returns the wrong items fast is worse than a slow one.
"""

from __future__ import annotations

import hashlib
import io
import threading
import time

import numpy as np
import pytest
import torch
from PIL import Image
from torch.utils.data import BatchSampler, DataLoader, Dataset, RandomSampler

from concurrent_loader import ConcurrentDataLoader, FetchConfig, ImageFolder, ObjectDataset
from concurrent_loader.stores import S3Config


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def expected_batches(
    n: int, batch_size: int, seed: int, drop_last: bool = False
) -> list[list[int]]:
    """The batches a stock DataLoader draws with a generator seeded with ``seed``."""
    stock = DataLoader(
        range(n),  # type: ignore[arg-type]
        batch_size=batch_size,
        shuffle=True,
        generator=torch.Generator().manual_seed(seed),
        drop_last=drop_last,
        collate_fn=list,
    )
    return list(stock)


def hashed_dataset(image_dataset, *, endpoint_url: str | None = None, **kwargs) -> ObjectDataset:
    keys = [f for f, _, _ in image_dataset.files]
    root = S3Config.from_url(image_dataset.s3_url, endpoint_url=endpoint_url)
    return ObjectDataset(root, keys, decode=sha256_hex, **kwargs)


def sha_of(image_dataset) -> list[str]:
    return [digest for _, _, digest in image_dataset.files]


@pytest.mark.parametrize(
    "num_workers,context", [(0, None), (2, "fork"), (2, "spawn"), (2, "forkserver")]
)
def test_every_sample_once_in_sampler_order(image_dataset, s3_env, num_workers, context):
    ds = hashed_dataset(image_dataset)
    loader = ConcurrentDataLoader(
        ds,
        batch_size=5,
        shuffle=True,
        num_workers=num_workers,
        multiprocessing_context=context,
        generator=torch.Generator().manual_seed(7),
    )
    batches = [list(b) for b in loader]
    digests = sha_of(image_dataset)
    want = [[digests[i] for i in batch] for batch in expected_batches(len(ds), 5, 7)]
    assert batches == want
    flat = [d for b in batches for d in b]
    assert sorted(flat) == sorted(digests)  # exactly once
    assert len(loader) == len(want)


def test_seeded_shuffle_is_repeatable_and_seed_dependent(image_dataset, s3_env):
    ds = hashed_dataset(image_dataset)

    def run(seed: int) -> list[list[str]]:
        loader = ConcurrentDataLoader(
            ds, batch_size=4, shuffle=True, generator=torch.Generator().manual_seed(seed)
        )
        return [list(b) for b in loader]

    assert run(3) == run(3)
    assert run(3) != run(4)


def test_epochs_reshuffle(image_dataset, s3_env):
    ds = hashed_dataset(image_dataset)
    loader = ConcurrentDataLoader(
        ds, batch_size=4, shuffle=True, num_workers=2, generator=torch.Generator().manual_seed(0)
    )
    first, second = ([d for b in loader for d in b] for _ in range(2))
    assert sorted(first) == sorted(second) == sorted(sha_of(image_dataset))
    assert first != second


def _reference_image(path, size):
    from concurrent_loader.decode import ImageDecoder

    return ImageDecoder(size)(path.read_bytes())


@pytest.mark.parametrize("num_workers", [0, 2])
def test_image_folder_items_match_their_keys(image_dataset, s3_env, num_workers):
    ds = ImageFolder(image_dataset.s3_url, image_size=32)
    assert ds.classes == image_dataset.classes
    loader = ConcurrentDataLoader(ds, batch_size=6, num_workers=num_workers)
    images, labels = (torch.cat(parts) for parts in zip(*loader, strict=True))
    assert images.dtype == torch.uint8 and images.shape[1:] == (3, 32, 32)
    assert labels.dtype == torch.int64
    assert len(images) == len(image_dataset.files)
    for i, key in enumerate(ds.keys):
        cls = key.split("/", 1)[0]
        assert labels[i].item() == image_dataset.classes.index(cls)
        reference = _reference_image(image_dataset.local_root / key, 32)
        assert torch.equal(images[i], reference), key


def test_full_size_default_output_is_the_decoded_image(image_dataset, s3_env):
    ds = ImageFolder(image_dataset.s3_url)
    image, label = ds[0]
    path = image_dataset.local_root / ds.keys[0]
    pixels = np.asarray(Image.open(io.BytesIO(path.read_bytes())).convert("RGB"))
    assert torch.equal(image, torch.from_numpy(pixels.copy()).permute(2, 0, 1))
    assert label == ds.class_to_idx[ds.keys[0].split("/")[0]]
    ds.close()


def test_local_and_s3_and_stock_dataloader_agree(image_dataset, s3_env):
    remote = ImageFolder(image_dataset.s3_url, image_size=24)
    local = ImageFolder(image_dataset.local_root, image_size=24)
    assert list(remote.keys) == list(local.keys)

    def ours(ds):
        return list(
            ConcurrentDataLoader(
                ds, batch_size=4, shuffle=True, generator=torch.Generator().manual_seed(5)
            )
        )

    stock = list(
        DataLoader(remote, batch_size=4, shuffle=True, generator=torch.Generator().manual_seed(5))
    )
    for got in (ours(remote), ours(local)):
        assert len(got) == len(stock)
        for (xa, ya), (xb, yb) in zip(got, stock, strict=True):
            assert torch.equal(xa, xb) and torch.equal(ya, yb)
    remote.close()


def test_gets_are_pipelined_across_batch_boundaries(
    image_dataset, s3_server, s3_env, proxy_factory
):
    proxy = proxy_factory(latency_ms=150)
    proxy.reset_stats()
    fetch_config = FetchConfig(max_inflight_requests=12)
    ds = hashed_dataset(image_dataset, endpoint_url=proxy.endpoint_url, fetch_config=fetch_config)
    batch_size = 3
    loader = ConcurrentDataLoader(ds, batch_size=batch_size, prefetch_batches=4)
    batches = list(loader)
    stats = proxy.stats()
    assert sum(len(b) for b in batches) == len(ds)
    # More GETs were in flight at once than one batch holds: later batches were being
    # fetched while earlier ones were still outstanding.
    assert stats["max_inflight"] > batch_size


class SlowDataset(Dataset[int]):
    """Not one of ours: __getitem__ blocks like a remote read."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.lock = threading.Lock()
        self.active = 0
        self.peak = 0

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> int:
        with self.lock:
            self.active += 1
            self.peak = max(self.peak, self.active)
        time.sleep(0.05)
        with self.lock:
            self.active -= 1
        return index


def test_foreign_dataset_gets_concurrency_and_order():
    ds = SlowDataset(48)
    loader = ConcurrentDataLoader(ds, batch_size=4, prefetch_batches=4)
    got = [b.tolist() for b in loader]
    assert got == [list(range(i, i + 4)) for i in range(0, 48, 4)]
    assert ds.peak > 4


def test_no_thread_left_after_break(image_dataset, s3_env):
    before = set(threading.enumerate())
    ds = hashed_dataset(image_dataset)
    loader = ConcurrentDataLoader(ds, batch_size=2)
    for _ in loader:
        break
    del _
    deadline = time.monotonic() + 5
    while set(threading.enumerate()) - before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert set(threading.enumerate()) - before == set()


def test_persistent_workers_follow_each_epochs_plan(image_dataset, s3_env):
    ds = hashed_dataset(image_dataset)
    gen = torch.Generator().manual_seed(11)
    loader = ConcurrentDataLoader(
        ds, batch_size=5, shuffle=True, num_workers=2, persistent_workers=True, generator=gen
    )
    digests = sha_of(image_dataset)
    reference = torch.Generator().manual_seed(11)
    for epoch in range(3):
        got = [list(b) for b in loader]
        # As torch: the workers' base seed is drawn from the generator first, once, as
        # persistent workers start only once; then each epoch's order.
        if epoch == 0:
            torch.empty((), dtype=torch.int64).random_(generator=reference)
        sampler = RandomSampler(range(len(ds)), generator=reference)
        want = [[digests[i] for i in b] for b in BatchSampler(sampler, 5, False)]
        assert got == want


def test_sampler_batch_sampler_drop_last_and_unbatched(image_dataset, s3_env):
    ds = hashed_dataset(image_dataset)
    digests = sha_of(image_dataset)
    order = list(reversed(range(len(ds))))
    loader = ConcurrentDataLoader(ds, batch_size=7, sampler=order, drop_last=True)
    by_sampler = [list(b) for b in loader]
    assert by_sampler == [[digests[i] for i in order[j : j + 7]] for j in range(0, len(ds) - 6, 7)]
    custom = [[3, 1], [0], [5, 4, 2]]
    assert [list(b) for b in ConcurrentDataLoader(ds, batch_sampler=custom, num_workers=2)] == [
        [digests[i] for i in b] for b in custom
    ]
    single = list(ConcurrentDataLoader(ds, batch_size=None, sampler=[2, 0]))
    assert single == [digests[2], digests[0]]
