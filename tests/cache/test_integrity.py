"""What a cache serves is checked on every read path, against the real local S3 server
(GETs counted at a proxy): a damaged entry is a miss, fetched again and rewritten, never
served; an entry written on the local path (the cache holding the whole dataset) keeps the
object's ETag."""

from __future__ import annotations

import asyncio
import gc
import random
from pathlib import Path
from typing import Any

import pytest

from concurrent_loader import FetchConfig, HedgeConfig, ObjectDataset
from concurrent_loader.cache import CachedStoreConfig
from concurrent_loader.cache.cached import source_prefix
from concurrent_loader.cache.directory import name_for
from concurrent_loader.stores import S3Config

from ._entries import read_entry

NO_HEDGES = FetchConfig(hedge=HedgeConfig(enabled=False))
COUNT = 8


@pytest.fixture(scope="module")
def stored(s3_server: Any, s3_bucket: str) -> dict[str, bytes]:
    rng = random.Random(7)
    objects = {f"{i:02d}.bin": rng.randbytes(3000) for i in range(COUNT)}
    for key, data in objects.items():
        s3_server.put_object(s3_bucket, "cache/integrity/" + key, data)
    return objects


def _dataset(proxy: Any, bucket: str, cache: Any) -> ObjectDataset:
    return ObjectDataset(
        S3Config.from_url(f"s3://{bucket}/cache/integrity/", endpoint_url=proxy.endpoint_url),
        keys=[f"{i:02d}.bin" for i in range(COUNT)],
        cache=cache,
        fetch_config=NO_HEDGES,
    )


def _gets(proxy: Any) -> int:
    return int(proxy.stats()["requests_by_method"].get("GET", 0))


def _entry(config: CachedStoreConfig, key: str) -> tuple[Path, str]:
    """The entry file of ``key``, and the source it is written for."""
    source = source_prefix(config.inner) + config.url_for(key)
    name = name_for(source)
    return Path(config.cache.directory) / "entries" / name[:2] / name, source


def _flip_a_byte(path: Path, at: int) -> None:
    raw = bytearray(path.read_bytes())
    raw[at] ^= 0x01
    path.write_bytes(bytes(raw))


def _fill(config: CachedStoreConfig, keys: list[str]) -> list[bytes]:
    """Read ``keys`` through the cache, waiting until their entries are written."""

    async def run() -> list[bytes]:
        store = config.open(NO_HEDGES)
        try:
            got = [bytes((await store.get(key)).data) for key in keys]
            await store.flush()
            return got
        finally:
            await store.close()

    return asyncio.run(run())


def _read_on_the_loop(config: CachedStoreConfig, key: str) -> tuple[bytes, bool]:
    async def run() -> tuple[bytes, bool]:
        store = config.open(NO_HEDGES)
        try:
            body = await store.get(key)
            await store.flush()
            return bytes(body.data), not body.round_trip
        finally:
            await store.close()

    return asyncio.run(run())


@pytest.mark.parametrize("path", ["loop", "local", "getitem"])
def test_a_flipped_byte_is_a_miss_fetched_again_and_rewritten(
    stored, s3_bucket, s3_env, proxy_factory, cache_dir, path
):
    proxy = proxy_factory()
    dataset = _dataset(proxy, s3_bucket, str(cache_dir))
    try:
        config = dataset.store
        assert isinstance(config, CachedStoreConfig)
        keys = sorted(stored)
        assert _fill(config, keys) == [stored[k] for k in keys]
        assert _gets(proxy) == COUNT
        key = keys[3]
        entry, source = _entry(config, key)
        _flip_a_byte(entry, 1234)  # in the object's bytes
        if path == "loop":
            served = _read_on_the_loop(dataset.store.for_keys([]), key)[0]
        elif path == "local":
            assert config.complete()
            store = config.open(NO_HEDGES)
            assert not store.capabilities.remote
            served = bytes(store.get_blocking(key))
            del store  # the local path is never closed: collection ends it
            gc.collect()
        else:
            served = bytes(dataset[3])
        assert served == stored[key]
        assert _gets(proxy) == COUNT + 1
        rewritten = read_entry(str(entry), source)
        assert rewritten is not None and bytes(rewritten.data) == stored[key]
    finally:
        dataset.close()
        gc.collect()  # the local path's store ends when collected


def test_an_entry_written_on_the_local_path_keeps_its_etag(
    stored, s3_server, s3_bucket, s3_env, proxy_factory, cache_dir
):
    proxy = proxy_factory()
    dataset = _dataset(proxy, s3_bucket, str(cache_dir))
    try:
        config = dataset.store
        assert isinstance(config, CachedStoreConfig)
        keys = sorted(stored)
        assert _fill(config, keys) == [stored[k] for k in keys]
        assert config.complete()
        key = keys[5]
        entry, source = _entry(config, key)
        entry.unlink()
        assert bytes(dataset[5]) == stored[key]  # the local path: fetched, written again
        client = s3_server.client()
        try:
            etag = client.head_object(Bucket=s3_bucket, Key="cache/integrity/" + key)["ETag"]
        finally:
            client.close()
        rewritten = read_entry(str(entry), source)
        assert rewritten is not None and rewritten.etag == etag
    finally:
        dataset.close()
        gc.collect()  # the local path's store ends when collected
