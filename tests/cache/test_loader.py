"""A loader reading through the cache: the second epoch reads nothing from the store, and
``stats()`` says so."""

from __future__ import annotations

import pytest

from concurrent_loader import ConcurrentDataLoader, FetchConfig, ObjectDataset
from concurrent_loader.cache import CacheConfig
from concurrent_loader.testing.memory import MemoryConfig

from .conftest import index_of, numbered_objects


@pytest.mark.parametrize("num_workers", [0, 2])
def test_epoch_two_is_served_from_the_cache(cache_dir, num_workers):
    objects = numbered_objects(40)
    memory = MemoryConfig(objects, latency_s=0.001)
    dataset = ObjectDataset(memory, decode=index_of, cache=CacheConfig(str(cache_dir)))
    loader = ConcurrentDataLoader(
        dataset,
        batch_size=8,
        shuffle=True,
        num_workers=num_workers,
        multiprocessing_context="fork" if num_workers else None,
    )
    first = sorted(i for batch in loader for i in batch.tolist())
    gets_after_first = memory.stats.total if num_workers == 0 else None
    second = sorted(i for batch in loader for i in batch.tolist())
    assert first == second == list(range(40))
    if gets_after_first is not None:  # the store's counters live in this process only
        assert memory.stats.total == gets_after_first == 40
    stats = loader.stats()
    assert stats["cache_hits"] == 40 and stats["cache_misses"] == 40
    assert stats["cache_bytes"] == 40 * 1000
    assert stats["cache_hit_rate"] == pytest.approx(0.5)


@pytest.mark.slow
@pytest.mark.parametrize("context", ["spawn", "forkserver"])
def test_every_start_method_reads_through_the_cache(cache_dir, context):
    objects = numbered_objects(24)
    dataset = ObjectDataset(MemoryConfig(objects), decode=index_of, cache=str(cache_dir))
    loader = ConcurrentDataLoader(
        dataset, batch_size=8, num_workers=2, multiprocessing_context=context
    )
    for _ in range(2):
        assert sorted(i for batch in loader for i in batch.tolist()) == list(range(24))
    stats = loader.stats()
    assert (stats["cache_hits"], stats["cache_misses"]) == (24, 24)


def test_epoch_two_of_a_full_cache_skips_the_event_loop(cache_dir, monkeypatch):
    from concurrent_loader.cache import CachedStore

    objects = numbered_objects(16)
    dataset = ObjectDataset(MemoryConfig(objects), decode=index_of, cache=str(cache_dir))
    loader = ConcurrentDataLoader(dataset, batch_size=4, shuffle=True)
    assert sorted(i for batch in loader for i in batch.tolist()) == list(range(16))

    async def not_on_the_loop(self: object, key: str, byte_range: object = None) -> None:
        raise AssertionError(f"{key} was read through the event loop")

    monkeypatch.setattr(CachedStore, "get", not_on_the_loop)
    assert sorted(i for batch in loader for i in batch.tolist()) == list(range(16))
    assert loader.stats()["cache_hits"] == 16


def test_an_object_large_enough_for_parts_is_read_whole_and_cached(cache_dir):
    # Listed sizes over PartsConfig.part_size would send each object as ranged parts, which
    # the cache does not keep; a whole object it can keep is read in one GET instead.
    from concurrent_loader.cache.writer import MAX_ENTRY_BYTES
    from concurrent_loader.fetch.parts import DEFAULT_PART_SIZE

    size = DEFAULT_PART_SIZE + 1024
    assert size <= MAX_ENTRY_BYTES
    objects = {f"{i}.bin": bytes([i]) * size for i in range(3)}
    memory = MemoryConfig(objects)
    dataset = ObjectDataset(memory, cache=str(cache_dir))  # listed: sizes known
    loader = ConcurrentDataLoader(dataset, batch_size=1)
    for _ in range(2):
        assert [bytes(batch[0]) for batch in loader] == [objects[k] for k in sorted(objects)]
    assert memory.stats.total == 3  # one GET each, in the first epoch only
    stats = loader.stats()
    assert (stats["cache_hits"], stats["cache_misses"]) == (3, 3)


def test_an_object_larger_than_the_cache_takes_is_still_read_in_parts(cache_dir):
    from concurrent_loader.cache.writer import MAX_ENTRY_BYTES
    from concurrent_loader.fetch.parts import DEFAULT_PART_SIZE

    size = MAX_ENTRY_BYTES + 1
    memory = MemoryConfig({"big.bin": b"x" * size})
    dataset = ObjectDataset(memory, cache=str(cache_dir))
    loader = ConcurrentDataLoader(dataset, batch_size=1)
    assert [len(batch[0]) for batch in loader] == [size]
    parts = -(-size // DEFAULT_PART_SIZE)
    assert memory.stats.total == parts + 1  # the parts, and the check that it did not grow


@pytest.mark.parametrize("disk_s", [0.0, 0.03])
def test_a_batch_of_large_entries_is_cached_whole_without_waiting_for_the_disk(
    cache_dir, monkeypatch, disk_s
):
    # A batch of large entries (pre-sized raw pixels, say) arrives at once: all of it is
    # written, and a slow disk never holds a GET (which would be timed and hedged as slow:
    # the same object fetched twice).
    import time

    from concurrent_loader.cache.directory import CacheDirectory
    from concurrent_loader.config import HedgeConfig

    put = CacheDirectory.put

    def slow_put(self: CacheDirectory, *args: object, **kwargs: object) -> object:
        time.sleep(disk_s)
        return put(self, *args, **kwargs)

    monkeypatch.setattr(CacheDirectory, "put", slow_put)
    size, count = 1 << 20, 64  # 64 MiB at once, twice the entry limit
    objects = {f"{i:03}.bin": bytes([i]) * size for i in range(count)}
    memory = MemoryConfig(objects, latency_s=0.05)
    fetch = FetchConfig(max_inflight_requests=count, hedge=HedgeConfig(max_delay=0.3))
    dataset = ObjectDataset(memory, decode=len, cache=str(cache_dir), fetch_config=fetch)
    loader = ConcurrentDataLoader(dataset, batch_size=count)
    for _ in range(2):
        assert [batch.tolist() for batch in loader] == [[size] * count]
    assert memory.stats.total == count
    assert (loader.stats()["cache_hits"], loader.stats()["cache_misses"]) == (count, count)
