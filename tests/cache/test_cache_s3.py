"""The cache end to end, against the real local S3 server, GETs counted at the proxy.

Every test reads its own prefix of the session's bucket through a
:class:`~concurrent_loader.testing.ProxyProcess` and checks the samples byte for byte.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import multiprocessing
import os
import random
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from concurrent_loader import ConcurrentDataLoader, FetchConfig, HedgeConfig, ObjectDataset
from concurrent_loader.cache import CacheConfig, CachedStoreConfig, describe_cache
from concurrent_loader.stores import S3Config

from . import _children

SIZE = 4096


def _upload(server: Any, bucket: str, prefix: str, count: int, seed: int) -> dict[str, bytes]:
    rng = random.Random(seed)
    objects = {f"{i:04d}.bin": rng.randbytes(SIZE) for i in range(count)}
    client = server.client()
    try:
        for key, data in objects.items():
            client.put_object(Bucket=bucket, Key=prefix + key, Body=data)
    finally:
        client.close()
    return objects


@pytest.fixture(scope="module")
def stored(s3_server: Any, s3_bucket: str) -> dict[str, bytes]:
    """100 objects of 4 KB random bytes under ``cache/objects/``, shared by the tests that
    do not change them."""
    return _upload(s3_server, s3_bucket, "cache/objects/", 100, seed=1)


def _gets(proxy: Any) -> int:
    return int(proxy.stats()["requests_by_method"].get("GET", 0))


def _digests(loader: ConcurrentDataLoader) -> list[str]:
    return [hashlib.sha256(body).hexdigest() for batch in loader for body in batch]


# A hedge is a deliberate second GET for a slow one; on a loaded machine one may be sent as
# an epoch ends and reach the proxy after its counters were reset. These tests count GETs
# exactly, so they turn hedging off.
NO_HEDGES = FetchConfig(hedge=HedgeConfig(enabled=False))


def _dataset(proxy: Any, bucket: str, prefix: str, keys: list[str], cache: Any) -> ObjectDataset:
    return ObjectDataset(
        S3Config.from_url(f"s3://{bucket}/{prefix}", endpoint_url=proxy.endpoint_url),
        keys=keys,
        cache=cache,
        fetch_config=NO_HEDGES,
    )


@pytest.fixture
def bucket(s3_bucket: str, s3_env: dict[str, str]) -> str:
    return s3_bucket


def test_epoch_two_sends_no_get_and_reads_the_same_bytes(stored, bucket, proxy_factory, cache_dir):
    objects = stored
    proxy = proxy_factory(latency_ms=5)
    keys = sorted(objects)[:64]
    dataset = _dataset(proxy, bucket, "cache/objects/", keys, str(cache_dir))
    loader = ConcurrentDataLoader(dataset, batch_size=8, num_workers=2, shuffle=False)
    want = [hashlib.sha256(objects[k]).hexdigest() for k in keys]
    assert _digests(loader) == want
    assert _gets(proxy) == 64
    # the cache holds the whole dataset: epoch 2 reads it as a local directory is read
    assert not dataset.store.capabilities.remote
    proxy.reset_stats()
    assert _digests(loader) == want
    assert _gets(proxy) == 0
    stats = loader.stats()
    assert stats["cache_hits"] == 64 and stats["cache_misses"] == 64
    # the workers, which keep their store open to the end, recorded their reads as they exited
    info = describe_cache(str(cache_dir))
    assert (info["entries"], info["hits"], info["misses"]) == (64, 64, 64)


def test_half_the_budget_sends_half_the_gets_under_fill(stored, bucket, proxy_factory, cache_dir):
    count = 100
    objects = stored
    proxy = proxy_factory()
    keys = sorted(objects)
    cache_dir.mkdir()
    # what one entry takes on disk: its bytes, ETag and name, and a 20-byte tail
    probe = _dataset(proxy, bucket, "cache/objects/", keys[:1], str(cache_dir))
    list(ConcurrentDataLoader(probe, batch_size=1))
    entry_size = describe_cache(str(cache_dir))["bytes"]
    assert SIZE < entry_size < SIZE + 200
    from concurrent_loader.cache import clear_cache

    clear_cache(str(cache_dir))
    budget = count * entry_size // 2
    dataset = _dataset(
        proxy, bucket, "cache/objects/", keys, CacheConfig(str(cache_dir), max_bytes=budget)
    )
    loader = ConcurrentDataLoader(dataset, batch_size=10, num_workers=2, shuffle=True)
    list(loader)
    proxy.reset_stats()
    assert len(_digests(loader)) == count
    assert abs(_gets(proxy) - count / 2) <= 0.02 * count
    assert describe_cache(str(cache_dir))["bytes"] <= budget


@pytest.mark.slow
def test_two_loaders_in_two_processes_fetch_each_object_once(
    stored, bucket, proxy_factory, cache_dir
):
    # Every GET takes a second, and each loader asks for all 32 objects at once: the two
    # start within a second of each other, so they miss the same objects together.
    count = 32
    objects = stored
    proxy = proxy_factory(latency_ms=1000)
    keys = sorted(objects)[:count]
    dataset = _dataset(proxy, bucket, "cache/objects/", keys, str(cache_dir))
    context = multiprocessing.get_context("spawn")
    start = context.Barrier(2)
    outs = [str(cache_dir.parent / f"out{i}.json") for i in range(2)]
    readers = [
        context.Process(target=_children.read_epoch, args=(dataset, out, start)) for out in outs
    ]
    for reader in readers:
        reader.start()
    for reader in readers:
        reader.join(120)
        assert reader.exitcode == 0
    want = {str(i): hashlib.sha256(objects[k]).hexdigest() for i, k in enumerate(keys)}
    for out in outs:
        assert json.loads(Path(out).read_text()) == want
    # both read every object in the same order at the same time: still one GET each
    assert _gets(proxy) == count


@pytest.mark.slow
@pytest.mark.parametrize("where", ["data", "rename"])
def test_a_writer_killed_mid_write_leaves_nothing_that_is_served(
    s3_server, bucket, proxy_factory, cache_dir, where
):
    objects = _upload(s3_server, bucket, f"cache/kill-{where}/", 1, seed=4)
    key = next(iter(objects))
    proxy = proxy_factory()
    dataset = _dataset(proxy, bucket, f"cache/kill-{where}/", [key], str(cache_dir))
    config = dataset.store
    assert isinstance(config, CachedStoreConfig)
    marker = cache_dir.parent / "marker"
    context = multiprocessing.get_context("spawn")
    child = context.Process(target=_children.write_and_hang, args=(config, key, str(marker), where))
    child.start()
    try:
        deadline = time.monotonic() + 60
        while not marker.exists():
            assert child.is_alive() and time.monotonic() < deadline, "the child never wrote"
            time.sleep(0.02)
        os.kill(child.pid, signal.SIGKILL)
    finally:
        child.join(10)
    assert child.exitcode == -signal.SIGKILL
    assert list((cache_dir / "tmp").iterdir()), "the half-written entry should be left in tmp/"
    assert not [p for p in (cache_dir / "entries").rglob("*") if p.is_file()]
    proxy.reset_stats()

    async def read_twice() -> list[bytes]:
        store = config.open(FetchConfig())
        try:
            first = bytes((await store.get(key)).data)
            await store.flush()
            return [first, bytes((await store.get(key)).data)]
        finally:
            await store.close()

    assert asyncio.run(read_twice()) == [objects[key]] * 2
    assert _gets(proxy) == 1  # fetched again once, then a hit
    info = describe_cache(str(cache_dir))
    # a kill between the ledger and the rename leaves it counting one entry too many
    assert info["bytes"] <= info["ledger_bytes"]


def test_an_entry_is_trusted_after_its_object_changes(s3_server, bucket, proxy_factory, cache_dir):
    prefix = "cache/changed/"
    objects = _upload(s3_server, bucket, prefix, 4, seed=5)
    proxy = proxy_factory()
    keys = sorted(objects)
    cache = CacheConfig(str(cache_dir))
    loader = ConcurrentDataLoader(_dataset(proxy, bucket, prefix, keys, cache), batch_size=4)
    assert [bytes(b) for b in next(iter(loader))] == [objects[k] for k in keys]
    s3_server.put_object(bucket, prefix + keys[0], b"changed")
    proxy.reset_stats()
    got = [bytes(b) for b in next(iter(loader))]
    # the documented choice: an entry is never revalidated (clear the cache instead)
    assert got == [objects[k] for k in keys]
    assert _gets(proxy) == 0
