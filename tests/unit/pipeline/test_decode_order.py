"""Samples are decoded earliest batch first, whatever order their GETs complete in: the batch
the consumer waits for is not decoded after samples of later batches."""

from __future__ import annotations

import threading
import time
from typing import Any

from concurrent_loader import ObjectDataset
from concurrent_loader.pipeline import BatchPipeline, PipelineOptions
from concurrent_loader.pipeline.slot import DecodeQueue, Slot
from concurrent_loader.stores import MemoryConfig


def test_the_queue_runs_the_earliest_batch_first():
    queue = DecodeQueue()
    ran: list[tuple[int, int]] = []
    slots = [Slot([0, 1, 2, 3], list, number) for number in range(3)]
    for number, position in [(2, 0), (0, 3), (1, 1), (0, 1), (1, 0)]:
        queue.put(slots[number], position, 10, lambda n=number, p=position: ran.append((n, p)))
    for _ in range(3):
        queue.run_first()
    assert ran == [(0, 1), (0, 3), (1, 0)]
    assert queue.drop_all() == 20  # the bytes of the two left
    queue.run_first()  # a job whose sample was dropped does nothing
    assert len(ran) == 3


def test_a_later_batch_s_samples_do_not_delay_the_first_batch(helpers):
    # Batch 1's GETs answer at once, batch 0's 20 ms later; each decode takes 40 ms on the
    # one decode thread. In completion order batch 0 would be decoded last.
    slow = {helpers.key_for(i) for i in range(4)}
    store_objects = helpers.numbered_objects(8)
    decoded: list[int] = []
    lock = threading.Lock()

    def decode(data: bytes | bytearray) -> int:
        time.sleep(0.04)
        index = helpers.index_of(data)
        with lock:
            decoded.append(index)
        return index

    store = MemoryConfig(store_objects, script=lambda key, attempt: 0.02 if key in slow else None)
    dataset: Any = ObjectDataset(store, decode=decode)
    options = PipelineOptions(prefetch_batches=2, decode_threads=1, max_inflight_requests=8)
    pipeline = BatchPipeline(
        dataset, [[0, 1, 2, 3], [4, 5, 6, 7]], collate_fn=list, options=options
    )
    assert list(pipeline) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    # Only what was decoding when batch 0 arrived comes before it.
    assert decoded.index(3) < decoded.index(7), decoded
