"""Closing a pipeline: a GET that never answers blocks only its own batch, and leaving the
loop cancels it and leaves no thread, loop or lease behind."""

from __future__ import annotations

import threading

from concurrent_loader import FetchConfig, ObjectDataset
from concurrent_loader.pipeline import BatchPipeline, PipelineOptions
from concurrent_loader.testing.memory import STALL, MemoryConfig

BATCHES = [list(range(i, i + 5)) for i in range(0, 30, 5)]


def test_stalled_get_blocks_only_its_batch_and_close_cancels_it(helpers):
    threads_before = set(threading.enumerate())
    stalled = helpers.key_for(12)  # batch 2
    later = {i for batch in BATCHES[3:] for i in batch}
    later_decoded = threading.Event()
    decoded: set[int] = set()
    lock = threading.Lock()

    def decode(data: bytes | bytearray) -> int:
        index = helpers.index_of(data)
        with lock:
            decoded.add(index)
            if later <= decoded:
                later_decoded.set()
        return index

    store = MemoryConfig(
        helpers.numbered_objects(30),
        script=lambda key, attempt: STALL if key == stalled else 0.001,
    )
    pipeline = BatchPipeline(
        ObjectDataset(store, decode=decode, fetch_config=FetchConfig(max_inflight_requests=8)),
        BATCHES,
        collate_fn=list,
        options=PipelineOptions(prefetch_batches=4),
    )
    batches = iter(pipeline)
    assert [next(batches), next(batches)] == BATCHES[:2]
    # Every sample of the batches after the stalled one is fetched and decoded meanwhile.
    assert later_decoded.wait(timeout=60)
    assert store.stats.in_flight == 1  # the stalled GET, still waiting
    assert any(t.name == "concurrent-loader-io" for t in threading.enumerate())

    batches.close()  # what leaving a for loop early does

    assert store.stats.in_flight == 0
    assert store.stats.gets[stalled] == 1
    assert set(threading.enumerate()) == threads_before
    pipeline.close()  # idempotent


def test_breaking_out_of_the_loop_closes_the_pipeline(helpers):
    threads_before = set(threading.enumerate())
    store = MemoryConfig(helpers.numbered_objects(30), latency_s=0.001)
    pipeline = BatchPipeline(
        ObjectDataset(store, decode=helpers.index_of),
        BATCHES,
        collate_fn=list,
        options=PipelineOptions(prefetch_batches=3),
    )
    for batch in pipeline:
        assert batch == BATCHES[0]
        break
    assert set(threading.enumerate()) == threads_before
    assert store.stats.in_flight == 0
    assert store.stats.total < 30  # the rest of the epoch was never fetched


def test_a_pipeline_closed_before_iteration_returns_its_lease(helpers):
    threads_before = set(threading.enumerate())
    store = MemoryConfig(helpers.numbered_objects(5))
    pipeline = BatchPipeline(
        ObjectDataset(store), [[0, 1]], collate_fn=list, options=PipelineOptions()
    )
    pipeline.close()
    pipeline.close()
    assert set(threading.enumerate()) == threads_before
    assert store.stats.total == 0


def test_two_pipelines_share_the_runtime_and_the_last_one_closes_it(helpers):
    threads_before = set(threading.enumerate())
    store = MemoryConfig(helpers.numbered_objects(10))
    dataset = ObjectDataset(store, decode=helpers.index_of)
    first = BatchPipeline(dataset, [[0, 1]], collate_fn=list, options=PipelineOptions())
    second = BatchPipeline(dataset, [[2, 3]], collate_fn=list, options=PipelineOptions())
    assert list(first) == [[0, 1]]
    io_threads = [t for t in threading.enumerate() if t.name == "concurrent-loader-io"]
    assert len(io_threads) == 1  # still leased by ``second``
    assert list(second) == [[2, 3]]
    assert set(threading.enumerate()) == threads_before
