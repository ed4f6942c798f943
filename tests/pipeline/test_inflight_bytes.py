"""The byte budget as the pipeline applies it: fetched-but-undecoded bytes, plus those
expected of the GETs in flight, stay within ``max_inflight_bytes``.

Measured from outside: the store's script counts each GET as it starts (its bytes are
reserved by then) and the decode function counts each body when it is done with it (its
bytes are released only after that), so ``started - decoded`` never exceeds what the budget
holds, and a slow decode makes bodies pile up against the limit.
"""

from __future__ import annotations

import random
import threading
import time
from typing import Any

from concurrent_loader import FetchConfig, ObjectDataset
from concurrent_loader.pipeline import BatchPipeline, PipelineOptions
from concurrent_loader.testing.memory import MemoryConfig


class Outstanding:
    """Bytes and bodies whose GET started and whose decode has not finished."""

    def __init__(self, objects: dict[str, bytes], index_of: Any) -> None:
        self.objects = objects
        self.index_of = index_of
        self.lock = threading.Lock()
        self.bytes = self.bodies = 0
        self.peak_bytes = self.peak_bodies = 0

    def script(self, key: str, attempt: int) -> float:
        with self.lock:
            self.bytes += len(self.objects[key])
            self.bodies += 1
            self.peak_bytes = max(self.peak_bytes, self.bytes)
            self.peak_bodies = max(self.peak_bodies, self.bodies)
        return 0.002

    def decode(self, data: bytes | bytearray) -> int:
        time.sleep(0.001)  # slower than the GETs: bodies wait for decoding
        with self.lock:
            self.bytes -= len(data)
            self.bodies -= 1
        return self.index_of(data)


def limits(max_inflight_bytes: int = 256 * 1024 * 1024) -> FetchConfig:
    """16 GETs in flight at most, within ``max_inflight_bytes``."""
    return FetchConfig(max_inflight_requests=16, max_inflight_bytes=max_inflight_bytes)


def run(dataset: ObjectDataset, batches: list[list[int]]) -> list[Any]:
    options = PipelineOptions(decode_threads=1, prefetch_batches=4)
    return list(BatchPipeline(dataset, batches, collate_fn=list, options=options))


def batches_of(count: int, size: int = 5) -> list[list[int]]:
    return [list(range(i, min(i + size, count))) for i in range(0, count, size)]


def test_bodies_held_stay_within_the_budget(helpers):
    objects = helpers.numbered_objects(40, size=1000)
    outstanding = Outstanding(objects, helpers.index_of)
    store = MemoryConfig(objects, script=outstanding.script)
    # listed: sizes known
    dataset = ObjectDataset(store, decode=outstanding.decode, fetch_config=limits(3500))
    assert run(dataset, batches_of(40)) == batches_of(40)
    assert outstanding.peak_bodies == 3  # bound reached, never passed
    assert store.stats.max_in_flight == 3  # the budget, not max_inflight_requests=16


def test_budget_from_the_fetch_config(helpers):
    objects = helpers.numbered_objects(20, size=1000)
    outstanding = Outstanding(objects, helpers.index_of)
    store = MemoryConfig(objects, script=outstanding.script)
    dataset = ObjectDataset(store, decode=outstanding.decode, fetch_config=limits(2000))
    assert run(dataset, batches_of(20)) == batches_of(20)
    assert outstanding.peak_bodies == 2


def test_bytes_of_mixed_sizes_stay_within_the_budget(helpers):
    rng = random.Random(11)
    sizes = {i: rng.randint(100, 3000) for i in range(60)}
    objects = helpers.numbered_objects(60, size=sizes.__getitem__)
    outstanding = Outstanding(objects, helpers.index_of)
    store = MemoryConfig(objects, script=outstanding.script)
    dataset = ObjectDataset(store, decode=outstanding.decode, fetch_config=limits(5000))
    assert run(dataset, batches_of(60)) == batches_of(60)
    assert outstanding.peak_bytes <= 5000
    assert store.stats.max_in_flight < 16


def test_an_object_larger_than_the_budget_still_loads_alone(helpers):
    objects = helpers.numbered_objects(12, size=100)
    store = MemoryConfig(objects, latency_s=0.001)
    dataset = ObjectDataset(store, decode=helpers.index_of, fetch_config=limits(10))
    assert run(dataset, batches_of(12, 4)) == batches_of(12, 4)
    assert store.stats.max_in_flight == 1


def test_first_get_of_unknown_size_goes_alone_then_the_mean_size_is_used(helpers):
    objects = helpers.numbered_objects(30, size=100)
    in_flight_at_start: list[int] = []
    store: MemoryConfig

    def script(key: str, attempt: int) -> float:
        in_flight_at_start.append(store.stats.in_flight)  # counts this GET too
        return 0.002

    store = MemoryConfig(objects, script=script)
    # keys given: no sizes
    dataset = ObjectDataset(
        store, list(objects), decode=helpers.index_of, fetch_config=limits(10_000)
    )
    assert dataset.source.sizes is None
    assert run(dataset, batches_of(30)) == batches_of(30)
    assert in_flight_at_start[:2] == [1, 1]  # the second waited for the first body
    assert store.stats.max_in_flight > 1
