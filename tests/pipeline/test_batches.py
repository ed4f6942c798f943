"""BatchPipeline: batch ``b`` is exactly ``batches[b]``, in order, each sample once.

GETs complete out of order (seeded random latencies per key), samples are checked by
identity (each body starts with its index), and concurrency is read from the store's
record of GETs in flight.
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from typing import Any

import pytest
from torch.utils.data import Dataset

from concurrent_loader import FetchConfig, HedgeConfig, ObjectDataset
from concurrent_loader.pipeline import BatchPipeline, PipelineOptions, source_of
from concurrent_loader.testing.memory import MemoryConfig

COUNT = 50


def split(order: list[int], batch_size: int, drop_last: bool = False) -> list[list[int]]:
    batches = [order[i : i + batch_size] for i in range(0, len(order), batch_size)]
    if drop_last and len(batches[-1]) < batch_size:
        batches.pop()
    return batches


def shuffled(count: int, seed: int) -> list[int]:
    order = list(range(count))
    random.Random(seed).shuffle(order)
    return order


def run(dataset: Dataset[Any], batches: list[list[int]], **options: Any) -> list[Any]:
    pipeline = BatchPipeline(dataset, batches, collate_fn=list, options=PipelineOptions(**options))
    return list(pipeline)


@pytest.mark.parametrize(
    ("batch_size", "prefetch_batches", "max_inflight_requests"),
    [(1, 1, 1), (3, 2, 4), (7, 3, 16), (16, 4, 64), (50, 2, 8)],
)
@pytest.mark.parametrize("drop_last", [False, True])
def test_batches_hold_exactly_the_planned_samples_in_order(
    helpers, batch_size, prefetch_batches, max_inflight_requests, drop_last
):
    store = MemoryConfig(helpers.numbered_objects(COUNT), script=helpers.jitter(batch_size, 0.003))
    fetch_config = FetchConfig(
        max_inflight_requests=max_inflight_requests, hedge=HedgeConfig(enabled=False)
    )
    dataset = ObjectDataset(store, decode=helpers.index_of, fetch_config=fetch_config)
    batches = split(shuffled(COUNT, seed=batch_size), batch_size, drop_last)
    got = run(dataset, batches, prefetch_batches=prefetch_batches, decode_threads=2)
    assert got == batches
    planned = [i for batch in batches for i in batch]
    assert store.stats.gets == Counter(helpers.key_for(i) for i in planned)
    assert store.stats.max_in_flight <= max_inflight_requests
    assert store.stats.in_flight == 0


def test_gets_complete_out_of_order(helpers):
    """The premise of the ordering tests: the store answers in another order than asked."""
    answered: list[int] = []
    script = helpers.jitter(1, 0.003)

    def decode(data: bytes | bytearray) -> int:
        answered.append(helpers.index_of(data))
        return helpers.index_of(data)

    store = MemoryConfig(helpers.numbered_objects(COUNT), script=script)
    batches = split(list(range(COUNT)), 10)
    fetch_config = FetchConfig(max_inflight_requests=16)
    got = run(ObjectDataset(store, decode=decode, fetch_config=fetch_config), batches)
    assert got == batches
    assert answered != sorted(answered)


def test_a_sample_planned_twice_is_delivered_twice(helpers):
    store = MemoryConfig(helpers.numbered_objects(5), script=helpers.jitter(2, 0.002))
    batches = [[3, 3, 1], [1], [4, 3]]
    assert run(ObjectDataset(store, decode=helpers.index_of), batches) == batches
    assert store.stats.gets[helpers.key_for(3)] == 3


def test_no_batches_yields_nothing(helpers):
    store = MemoryConfig(helpers.numbered_objects(3))
    assert run(ObjectDataset(store, decode=helpers.index_of), []) == []
    assert store.stats.total == 0


@pytest.mark.parametrize("limit", [2, 5, 12])
def test_gets_in_flight_reach_but_never_exceed_max_inflight_requests(helpers, limit):
    store = MemoryConfig(helpers.numbered_objects(60), latency_s=0.002)
    batches = split(list(range(60)), 6)
    fetch_config = FetchConfig(max_inflight_requests=limit)
    got = run(
        ObjectDataset(store, decode=helpers.index_of, fetch_config=fetch_config),
        batches,
        prefetch_batches=4,
    )
    assert got == batches
    assert store.stats.max_in_flight == limit


def test_a_batch_starts_once_the_one_prefetch_batches_before_it_is_complete(helpers):
    """At most ``prefetch_batches`` batches are in progress, and they do overlap."""
    prefetch = 3
    batches = split(list(range(60)), 4)
    batch_of = {helpers.key_for(i): b for b, batch in enumerate(batches) for i in batch}
    decoded: Counter[int] = Counter()
    lock = threading.Lock()
    too_early: list[int] = []
    overlapping: list[int] = []

    def complete(b: int) -> bool:
        return decoded[b] == len(batches[b])

    def script(key: str, attempt: int) -> float:
        b = batch_of[key]
        with lock:
            if b >= prefetch and not complete(b - prefetch):
                too_early.append(b)
            if b >= 1 and not complete(b - 1):
                overlapping.append(b)
        return 0.001

    def decode(data: bytes | bytearray) -> int:
        index = helpers.index_of(data)
        with lock:  # counted before the sample is put in its batch
            decoded[batch_of[helpers.key_for(index)]] += 1
        return index

    store = MemoryConfig(helpers.numbered_objects(60), script=script)
    fetch_config = FetchConfig(max_inflight_requests=64)
    got = run(
        ObjectDataset(store, decode=decode, fetch_config=fetch_config),
        batches,
        prefetch_batches=prefetch,
    )
    assert got == batches
    assert too_early == []
    assert overlapping  # the next batches' GETs are in flight while a batch completes


@pytest.mark.parametrize("decode_threads", [1, 4])
def test_local_stores_read_and_decode_on_the_pool_in_order(helpers, decode_threads):
    threads: set[str] = set()
    rng = random.Random(3)
    delays = {i: rng.uniform(0, 0.002) for i in range(COUNT)}

    def decode(data: bytes | bytearray) -> int:
        index = helpers.index_of(data)
        threads.add(threading.current_thread().name)
        time.sleep(delays[index])  # decodes finish out of order
        return index

    store = MemoryConfig(helpers.numbered_objects(COUNT), remote=False)
    batches = split(shuffled(COUNT, seed=4), 6)
    got = run(ObjectDataset(store, decode=decode), batches, decode_threads=decode_threads)
    assert got == batches
    assert store.stats.gets == Counter(helpers.key_for(i) for i in range(COUNT))
    assert all(name.startswith("concurrent-loader-local") for name in threads)
    assert 1 <= len(threads) <= decode_threads


class Squares(Dataset[int]):
    """A dataset that is not ours: no source, items come from ``__getitem__``."""

    def __init__(self, count: int) -> None:
        self.count = count
        self.delays = random.Random(5)

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: int) -> int:
        time.sleep(self.delays.uniform(0, 0.002))
        return index * index


def test_datasets_without_a_source_are_read_through_getitem_in_order():
    dataset = Squares(40)
    assert source_of(dataset) is None
    batches = split(shuffled(40, seed=6), 7)
    got = run(dataset, batches, getitem_threads=8)
    assert got == [[i * i for i in batch] for batch in batches]


def test_our_datasets_have_a_source(helpers):
    dataset = ObjectDataset(MemoryConfig(helpers.numbered_objects(2)))
    assert source_of(dataset) is dataset.source


def test_collate_runs_on_the_consumer_thread(helpers):
    collated_on: set[str] = set()

    def collate(items: list[int]) -> list[int]:
        collated_on.add(threading.current_thread().name)
        return items

    store = MemoryConfig(helpers.numbered_objects(10))
    pipeline = BatchPipeline(
        ObjectDataset(store, decode=helpers.index_of),
        split(list(range(10)), 3),
        collate_fn=collate,
        options=PipelineOptions(),
    )
    assert len(list(pipeline)) == 4
    assert collated_on == {threading.current_thread().name}


@pytest.mark.parametrize("follow_limit", [False, True])
def test_batches_in_progress_follow_a_self_tuned_limit_past_prefetch_batches(helpers, follow_limit):
    """Latency holds at any load: the self-tuned limit doubles past its start of 64, and
    with ``follow_limit`` the pipeline starts as many batches as keep it busy; without, two
    batches of 8 are all that is ever in flight."""
    count = 1500
    store = MemoryConfig(helpers.numbered_objects(count), latency_s=0.01)
    dataset = ObjectDataset(store, decode=helpers.index_of, fetch_config=FetchConfig())
    batches = split(shuffled(count, seed=1), 8)
    options = {"prefetch_batches": 2, "follow_limit": follow_limit, "decode_threads": 2}
    assert run(dataset, batches, **options) == batches
    if follow_limit:
        assert store.stats.max_in_flight > FetchConfig().inflight_start
    else:
        assert store.stats.max_in_flight <= 2 * 8
