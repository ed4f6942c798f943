"""``ShardDataset`` end to end over the real local S3 server: the same samples and bytes as
the ``webdataset`` library reads from the same shards, through ``ConcurrentDataLoader``
(batch i = sampler batch i, exact resume, DDP coverage), one GET per sample without
read-ahead and about one per span with it (counted at the server by the proxy)."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch
from PIL import Image
from torch.utils.data import DataLoader, DistributedSampler

from concurrent_loader import (
    ConcurrentDataLoader,
    FetchConfig,
    HedgeConfig,
    ImageSample,
    Readahead,
    ShardDataset,
)
from concurrent_loader.cli import main
from concurrent_loader.stores import S3Config
from concurrent_loader.streaming import ShardOrderSampler

from .conftest import webdataset_samples

pytest.importorskip("webdataset", reason="the webdataset library is in requirements-dev.txt")


def key_of(sample: dict) -> str:
    return sample["__key__"]


def keys_of(batch: dict) -> list[str]:
    return list(batch["__key__"])


def test_samples_match_webdataset_reading_the_same_shards(packed, s3_env):
    reference = webdataset_samples([packed.local / s for s in packed.shards])
    with ShardDataset(packed.s3_url) as ds:
        assert ds.shards == packed.shards
        assert sum(ds.shard_lengths) == len(ds) == len(reference)
        ours = ds.__getitems__(list(range(len(ds))))
    for mine, theirs in zip(ours, reference, strict=True):
        assert mine["__key__"] == theirs["__key__"]
        assert mine["__url__"] == f"{packed.s3_url}{theirs['__url__'].rsplit('/', 1)[1]}"
        assert {k: v for k, v in mine.items() if not k.startswith("__")} == {
            k: v for k, v in theirs.items() if not k.startswith("__")
        }


def test_shard_lengths_number_samples_shard_by_shard(packed, s3_env):
    ds = ShardDataset(packed.s3_url)
    start = 0
    for shard, length in zip(ds.shards, ds.shard_lengths, strict=True):
        for i in (start, start + length - 1):
            assert ds.source.url_for(i) == f"{packed.s3_url}{shard}"
        start += length
    assert start == len(ds)


def test_a_shard_without_index_is_scanned_to_the_same_samples(packed, s3_server, s3_env):
    name = packed.shards[0]
    s3_server.put_object(packed.bucket, f"noindex/{name}", (packed.local / name).read_bytes())
    indexed = ShardDataset(packed.s3_url, [name])
    scanned = ShardDataset(f"s3://{packed.bucket}/noindex/")
    assert len(scanned) == len(indexed) > 0
    assert [scanned[i] | {"__url__": None} for i in range(len(scanned))] == [
        indexed[i] | {"__url__": None} for i in range(len(indexed))
    ]


def test_the_dataset_pickles_without_anything_open(packed, s3_env):
    ds = ShardDataset(packed.s3_url)
    first = ds[0]  # leases this process's runtime: not part of the pickle
    copy = pickle.loads(pickle.dumps(ds))
    assert copy.shards == ds.shards and copy.shard_lengths == ds.shard_lengths
    assert copy[0] == first
    copy.close()
    ds.close()


@pytest.mark.parametrize(
    "num_workers,context",
    [(0, None), (2, "fork"), pytest.param(2, "spawn", marks=pytest.mark.slow)],
)
def test_loader_batches_are_the_samplers_batches(packed, s3_env, num_workers, context):
    ds = ShardDataset(packed.s3_url)
    loader = ConcurrentDataLoader(
        ds,
        batch_size=32,
        shuffle=True,
        generator=torch.Generator().manual_seed(4),
        num_workers=num_workers,
        multiprocessing_context=context,
    )
    stock = DataLoader(
        range(len(ds)),  # type: ignore[arg-type]
        batch_size=32,
        shuffle=True,
        generator=torch.Generator().manual_seed(4),
    )
    batches = list(loader)
    assert [keys_of(b) for b in batches] == [[packed.order[i] for i in b.tolist()] for b in stock]
    for batch in batches:
        for key, data in zip(batch["__key__"], batch["bin"], strict=True):
            assert data == packed.expected[key]["bin"]


def test_random_access_is_one_get_per_sample(packed, s3_server, s3_env, proxy_factory):
    """Random access without read-ahead, batch 64: one GET per sample, counted at the server."""
    proxy = proxy_factory()
    # No hedged GETs: every GET counted is one the plan asked for.
    exact = FetchConfig(hedge=HedgeConfig(enabled=False))
    ds = ShardDataset(
        S3Config.from_url(packed.s3_url, endpoint_url=proxy.endpoint_url), fetch_config=exact
    )
    loader = ConcurrentDataLoader(
        ds, batch_size=64, shuffle=True, generator=torch.Generator().manual_seed(1)
    )
    proxy.reset_stats()
    seen = [key for batch in loader for key in batch["__key__"]]
    assert sorted(seen) == packed.order
    assert proxy.stats()["requests_by_method"]["GET"] == len(seen)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_readahead_in_shard_order_reads_each_span_once_per_process(
    packed, s3_server, s3_env, proxy_factory, num_workers
):
    """Streaming order with read-ahead and a stream per worker: the sampler's batches, byte
    for byte, and about one GET per span (counted at the server), not one per sample."""
    proxy = proxy_factory()
    span = 64 * 1024
    ds = ShardDataset(
        S3Config.from_url(packed.s3_url, endpoint_url=proxy.endpoint_url),
        # Room for every span (31): how far ahead the pipeline runs, which is timing, never
        # leaves a sample without room (then read alone: the unit tests cover that).
        readahead=Readahead(span_bytes=span, max_bytes=64 * span),
        fetch_config=FetchConfig(hedge=HedgeConfig(enabled=False)),  # every GET a span's
    )
    # The loader hands the sampler its workers: each reads whole shards of its own.
    sampler = ShardOrderSampler(ds.shard_lengths, buffer_size=64, seed=3)
    loader = ConcurrentDataLoader(
        ds,
        batch_size=16,
        sampler=sampler,
        num_workers=num_workers,
        multiprocessing_context="fork" if num_workers else None,
    )
    proxy.reset_stats()
    batches = list(loader)
    assert [keys_of(b) for b in batches] == [
        [packed.order[i] for i in chunk]
        for chunk in torch.tensor(list(sampler)).split(16)  # the same seed, the same order
    ]
    for batch in batches:
        for key, data in zip(batch["__key__"], batch["bin"], strict=True):
            assert data == packed.expected[key]["bin"]
    gets = proxy.stats()["requests_by_method"]["GET"]
    spans = sum(-(-(packed.local / s).stat().st_size // span) for s in packed.shards)
    # Each span once; with 2 workers the streams' last batches, which mix, may read a few
    # spans of the other worker's shards too.
    assert gets <= spans + (8 if num_workers else 0), (gets, spans)


def test_exact_resume_mid_epoch(packed, s3_env):
    def loader() -> ConcurrentDataLoader:
        ds = ShardDataset(packed.s3_url)
        return ConcurrentDataLoader(
            ds,
            batch_size=40,
            shuffle=True,
            generator=torch.Generator().manual_seed(21),
            num_workers=2,
        )

    reference = [keys_of(b) for epoch in range(2) for b in loader()]
    interrupted = loader()
    it = iter(interrupted)
    prefix = [keys_of(next(it)) for _ in range(5)]
    state = pickle.loads(pickle.dumps(interrupted.state_dict()))
    del it
    resumed = loader()
    resumed.load_state_dict(state)
    rest = [keys_of(b) for b in resumed]
    epoch_len = len(reference) // 2
    assert prefix + rest == reference[:epoch_len]


@pytest.mark.parametrize("world_size", [2, 3])
def test_ddp_ranks_cover_every_sample(packed, s3_env, world_size):
    ds = ShardDataset(packed.s3_url)
    seen: list[str] = []
    for rank in range(world_size):
        sampler = DistributedSampler(
            ds, num_replicas=world_size, rank=rank, shuffle=True, seed=3, drop_last=True
        )
        sampler.set_epoch(1)
        loader = ConcurrentDataLoader(ds, batch_size=16, sampler=sampler)
        got = [key for batch in loader for key in batch["__key__"]]
        assert got == [packed.order[i] for i in sampler]
        seen.extend(got)
    assert len(seen) == len(set(seen)) == len(ds) // world_size * world_size


def test_image_sample_decodes_image_classification_shards(
    tmp_path, image_folder, s3_server, s3_bucket, s3_env
):
    root, files = image_folder
    assert main(["pack", str(root), str(tmp_path / "out"), "--image-folder", "--no-progress"]) == 0
    s3_server.upload_dir(tmp_path / "out", s3_bucket, prefix="image-shards/")
    ds = ShardDataset(f"s3://{s3_bucket}/image-shards/", decode=ImageSample())
    classes = sorted({name for _, name, _ in files})
    by_key = {key.rsplit(".", 1)[0]: (name, root / key) for key, name, _ in files}
    loader = ConcurrentDataLoader(ds, batch_size=5, collate_fn=list)
    items = [item for batch in loader for item in batch]
    assert len(items) == len(files)
    for i, (image, label) in enumerate(items):
        name, path = by_key[ds.source.sample_keys[i]]
        assert label == classes.index(name)
        with Image.open(path) as expected:
            want = torch.from_numpy(np.array(expected.convert("RGB"))).permute(2, 0, 1)
        assert torch.equal(image, want)
