"""CachedStore on the in-memory store: hits, misses, re-fetches, ranges, failures."""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import logging
import os
import shutil
from pathlib import Path

import pytest

from concurrent_loader import FetchConfig, HedgeConfig
from concurrent_loader.cache import CacheConfig, CachedStoreConfig, with_cache
from concurrent_loader.cache import directory as directory_module
from concurrent_loader.cache.directory import name_for
from concurrent_loader.errors import ConfigError, ObjectNotFound
from concurrent_loader.fetch import FetchClient, client_for
from concurrent_loader.metrics.stats import cache_tally
from concurrent_loader.stores import ByteRange, LocalConfig
from concurrent_loader.testing.memory import MemoryConfig

from .conftest import numbered_objects


def _read(
    config: CachedStoreConfig, keys: list[str], ranges: dict[str, ByteRange] | None = None
) -> list[bytes]:
    """The objects ``keys`` read through one store opened on a fresh loop, then closed."""

    async def run() -> list[bytes]:
        store = config.open(FetchConfig())
        try:
            return [bytes((await store.get(k, (ranges or {}).get(k))).data) for k in keys]
        finally:
            await store.close()

    return asyncio.run(run())


def _entry_path(config: CachedStoreConfig, key: str) -> Path:
    name = name_for(config.url_for(key))
    return Path(config.cache.directory) / "entries" / name[:2] / name


def test_a_second_read_is_a_hit_with_no_get(cache_config):
    objects = numbered_objects(5)
    memory = MemoryConfig(objects)
    config = CachedStoreConfig(memory, cache_config)
    keys = sorted(objects)
    before = cache_tally().snapshot()
    assert _read(config, keys) == [objects[k] for k in keys]
    assert memory.stats.total == 5
    assert _read(config, keys) == [objects[k] for k in keys]
    assert memory.stats.total == 5
    hits, misses, served = (a - b for a, b in zip(cache_tally().snapshot(), before, strict=True))
    assert (hits, misses, served) == (5, 5, 5 * 1000)


@pytest.mark.parametrize("damage", ["truncate", "flip"])
def test_a_damaged_entry_is_fetched_again_and_mended(cache_config, damage):
    objects = numbered_objects(3)
    memory = MemoryConfig(objects)
    config = CachedStoreConfig(memory, cache_config)
    _read(config, ["00001.bin"])
    path = _entry_path(config, "00001.bin")
    raw = bytearray(path.read_bytes())
    if damage == "truncate":
        raw = raw[: len(raw) // 2]
    else:
        raw[10] ^= 0xFF
    path.write_bytes(bytes(raw))
    assert _read(config, ["00001.bin"]) == [objects["00001.bin"]]
    assert memory.stats.gets["00001.bin"] == 2
    assert _read(config, ["00001.bin"]) == [objects["00001.bin"]]  # mended: a hit
    assert memory.stats.gets["00001.bin"] == 2


def test_ranges_are_cut_from_a_cached_object_and_otherwise_passed_on(cache_config):
    objects = numbered_objects(2)
    memory = MemoryConfig(objects)
    config = CachedStoreConfig(memory, cache_config)
    wanted = {"00000.bin": ByteRange(2, 8), "00001.bin": ByteRange(0, 6)}
    # not cached: the range goes to the store and nothing is cached
    assert _read(config, ["00000.bin"], wanted) == [objects["00000.bin"][2:8]]
    assert not _entry_path(config, "00000.bin").exists()
    _read(config, ["00001.bin"])
    gets = memory.stats.total
    assert _read(config, ["00001.bin"], wanted) == [b"000001"]
    assert memory.stats.total == gets


def test_the_store_errors_pass_through_and_nothing_is_cached(cache_config):
    config = CachedStoreConfig(MemoryConfig({}), cache_config)
    with pytest.raises(ObjectNotFound):
        _read(config, ["missing.bin"])
    assert not any((Path(cache_config.directory) / "entries").rglob("*.bin"))


def _misses_of_gets_at_once(config: CachedStoreConfig, ranges: list[ByteRange | None]) -> int:
    """Cache misses counted when GETs of one uncached object run at once, all to the end."""

    async def run() -> None:
        store = config.open(FetchConfig())
        try:
            await asyncio.gather(*(store.get("00000.bin", r) for r in ranges))
        finally:
            await store.close()

    before = cache_tally().snapshot()
    asyncio.run(run())
    return cache_tally().snapshot()[1] - before[1]


def test_gets_of_one_object_at_once_are_one_miss_and_two_ranges_are_two(cache_dir):
    # A GET and its hedge are such GETs: both may complete, and they are one miss.
    objects = numbered_objects(1)
    cases = [([None, None], 1), ([ByteRange(0, 2), ByteRange(2, 4)], 2)]
    for i, (ranges, misses) in enumerate(cases):
        memory = MemoryConfig(objects, latency_s=0.01)
        directory = cache_dir / str(i)
        directory.mkdir(parents=True)
        config = CachedStoreConfig(memory, CacheConfig(str(directory)).resolved())
        assert _misses_of_gets_at_once(config, ranges) == misses
        assert memory.stats.total == 2  # both reached the store either way


def test_hits_are_no_latency_samples_for_the_in_flight_limit_or_the_hedge_delay(cache_config):
    # Hits take no time, misses 30 ms. Were hits latency samples, the hedge delay would sink
    # to its floor on hits alone, and with half the objects cached the misses would look
    # like queueing (far above the hits' baseline) and cut the self-tuned limit.
    objects = numbered_objects(768)
    keys = sorted(objects)
    cached = keys[::2]
    _read(CachedStoreConfig(MemoryConfig(objects), cache_config), cached)  # no latency
    config = CachedStoreConfig(MemoryConfig(objects, latency_s=0.03), cache_config)

    async def run() -> tuple[float, int, int]:
        store = config.open(FetchConfig())
        client = FetchClient(store, FetchConfig())
        assert client.hedging is not None
        try:
            await asyncio.gather(*(client.get(k) for k in cached))
            delay_after_hits = client.hedging.delay.seconds
            await asyncio.gather(*(client.get(k) for k in keys))
            return delay_after_hits, client.limit.limit, client.limit.controller.rounds
        finally:
            await client.close()

    delay_after_hits, limit, rounds = asyncio.run(run())
    assert delay_after_hits == HedgeConfig().max_delay  # no latency known yet
    assert rounds >= 4  # the controller decided, several times
    assert limit >= FetchConfig().inflight_start  # never cut below where it started


def test_a_full_budget_under_fill_sends_the_rest_to_the_store(cache_dir):
    cache_dir.mkdir()
    objects = numbered_objects(10)
    memory = MemoryConfig(objects)
    entry = 1000 + len("memory://test/00000.bin") + 20
    config = CachedStoreConfig(memory, CacheConfig(str(cache_dir), max_bytes=4 * entry).resolved())
    keys = sorted(objects)
    _read(config, keys)
    _read(config, keys)
    assert memory.stats.total == 10 + 6  # 4 fit: the first 4 to arrive


def test_a_deleted_directory_warns_once_and_reads_go_on(cache_config, caplog):
    objects = numbered_objects(6)
    memory = MemoryConfig(objects)
    config = CachedStoreConfig(memory, cache_config)
    keys = sorted(objects)

    async def run() -> list[bytes]:
        store = config.open(FetchConfig())
        try:
            out = [bytes((await store.get(k)).data) for k in keys[:3]]
            await store.flush()
            shutil.rmtree(cache_config.directory)
            out += [bytes((await store.get(k)).data) for k in keys]
            return out
        finally:
            await store.close()

    with caplog.at_level(logging.WARNING, logger="concurrent_loader.cache"):
        got = asyncio.run(run())
    assert got == [objects[k] for k in keys[:3] + keys]
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and cache_config.directory in warnings[0].getMessage()


def test_a_full_disk_warns_once_then_caches_nothing(cache_config, caplog, monkeypatch):
    def no_space(dir_fd: int, name: str, data: object, tail: object) -> None:
        raise OSError(28, "No space left on device", name)

    monkeypatch.setattr(directory_module, "_write_file", no_space)
    objects = numbered_objects(5)
    memory = MemoryConfig(objects)
    config = CachedStoreConfig(memory, cache_config)
    keys = sorted(objects)
    with caplog.at_level(logging.WARNING, logger="concurrent_loader.cache"):
        assert _read(config, keys) == [objects[k] for k in keys]
        assert _read(config, keys) == [objects[k] for k in keys]
    assert memory.stats.total == 10
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2  # one per store opened (each _read opens one)
    assert "No space left on device" in warnings[0].getMessage()


def test_a_cache_that_cannot_be_made_leaves_the_dataset_uncached(tmp_path, caplog):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    memory = MemoryConfig(numbered_objects(1))
    with caplog.at_level(logging.WARNING, logger="concurrent_loader.cache"):
        assert with_cache(memory, str(blocker / "cache")) is memory
    assert "cannot be used" in caplog.text


def test_a_local_root_needs_no_cache(tmp_path):
    local = LocalConfig.from_path(str(tmp_path))
    assert with_cache(local, str(tmp_path / "cache")) is local
    with pytest.raises(ConfigError, match="needs no cache"):
        CachedStoreConfig(local, CacheConfig(str(tmp_path / "cache")))


def test_with_cache_resolves_the_directory_and_a_default_budget(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    config = with_cache(MemoryConfig({}), "relative/cache")
    assert isinstance(config, CachedStoreConfig)
    assert config.cache.directory == os.path.join(str(tmp_path), "relative", "cache")
    assert config.cache.max_bytes is not None and config.cache.max_bytes > 0
    assert (tmp_path / "relative" / "cache" / "ledger").exists()


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"directory": ""}, "non-empty path"),
        ({"directory": "d", "max_bytes": -1}, "max_bytes"),
        ({"directory": "d", "max_bytes": True}, "max_bytes"),
    ],
)
def test_bad_options_are_config_errors(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        CacheConfig(**kwargs)


def test_a_large_entry_is_read_off_the_loop_and_served(cache_config, monkeypatch):
    from concurrent_loader.cache import store as store_module

    monkeypatch.setattr(store_module, "MAX_INLINE_READ_BYTES", 100)
    objects = numbered_objects(2, size=5000)
    memory = MemoryConfig(objects)
    config = CachedStoreConfig(memory, cache_config)
    keys = sorted(objects)
    _read(config, keys)
    assert _read(config, keys) == [objects[k] for k in keys]
    assert memory.stats.total == 2


def test_a_filesystem_without_locks_still_caches(cache_config, caplog, monkeypatch):
    def no_locks(self: object, name: str) -> bool:
        raise OSError(37, "No locks available")

    monkeypatch.setattr(directory_module.CacheDirectory, "try_fill_lock", no_locks)
    objects = numbered_objects(3)
    memory = MemoryConfig(objects)
    config = CachedStoreConfig(memory, cache_config)
    keys = sorted(objects)
    with caplog.at_level(logging.WARNING, logger="concurrent_loader.cache"):
        _read(config, keys)
        assert _read(config, keys) == [objects[k] for k in keys]
    assert memory.stats.total == 3
    assert "No locks available" in caplog.text


def test_the_local_path_once_the_cache_holds_the_dataset(cache_config):
    objects = numbered_objects(20)
    memory = MemoryConfig(objects)
    keys = sorted(objects)
    config = CachedStoreConfig(memory, cache_config, client_for=client_for).for_keys(keys)
    assert config.object_count == 20 and len(config.sample_keys) == 20
    # Without a fetch client to read misses through, never the local path.
    assert dataclasses.replace(config, client_for=None).capabilities.remote
    assert config.capabilities.remote and not config.complete()
    _read(config, keys[:10])
    assert config.capabilities.remote  # half of it: still the remote path

    async def fill_the_rest() -> None:
        store = config.open(FetchConfig())
        try:
            for key in keys[10:]:
                await store.get(key)
            await store.flush()
            # Complete now, for a store opened next; this one keeps what it opened with.
            assert config.complete() and not config.capabilities.remote
            assert store.capabilities.remote
        finally:
            await store.close()

    asyncio.run(fill_the_rest())
    assert not config.open(FetchConfig()).capabilities.remote
    # Found complete once, it stays so in this process without looking again (a miss on
    # the local path is fetched): entries gone since do not send it back to the loop.
    shutil.rmtree(Path(cache_config.directory) / "entries")
    assert config.complete() and not config.capabilities.remote


def test_a_miss_on_the_local_path_is_fetched_and_cached_again(cache_config, monkeypatch):
    from concurrent_loader.cache import cached

    monkeypatch.setattr(cached, "SAMPLE_KEYS", 2)
    objects = numbered_objects(10)
    memory = MemoryConfig(objects)
    keys = sorted(objects)
    config = CachedStoreConfig(memory, cache_config, client_for=client_for).for_keys(keys)
    _read(config, keys)
    gone = next(k for k in keys if k not in config.sample_keys)
    _entry_path(config, gone).unlink()
    bad = next(k for k in keys if k not in config.sample_keys and k != gone)
    raw = bytearray(_entry_path(config, bad).read_bytes())
    raw[3] ^= 0xFF
    _entry_path(config, bad).write_bytes(bytes(raw))
    assert config.complete()  # the ledger still counts them, the sample is intact
    store = config.open(FetchConfig())
    assert not store.capabilities.remote and store.inner is None
    assert [bytes(store.get_blocking(k)) for k in keys] == [objects[k] for k in keys]
    assert bytes(store.get_blocking(keys[0], ByteRange(1, 4))) == objects[keys[0]][1:4]
    assert memory.stats.total == 10 + 2
    assert _entry_path(config, gone).exists()
    del store  # the local path is never closed: collection releases the runtime it took
    gc.collect()
    assert _read(config, [gone, bad]) == [objects[gone], objects[bad]]
    assert memory.stats.total == 12
