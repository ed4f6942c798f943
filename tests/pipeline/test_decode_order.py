"""Samples are decoded earliest batch first, whatever order their GETs complete in: the batch
the consumer waits for is not decoded after samples of later batches."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from concurrent_loader import FetchConfig, ObjectDataset
from concurrent_loader.pipeline import BatchPipeline, PipelineOptions
from concurrent_loader.pipeline.slot import DecodeQueue, Slot
from concurrent_loader.testing.memory import MemoryConfig


class Jobs:
    """A pool stand-in that runs nothing until told, and can say it is forking."""

    def __init__(self) -> None:
        self.queued: list[Any] = []
        self.forking = False
        self.shut = False

    def submit(self, job: Any) -> None:
        if self.shut:
            raise RuntimeError("cannot schedule new futures after shutdown")
        self.queued.append(job)

    def run_one(self) -> None:
        self.queued.pop(0)()


def test_the_queue_runs_the_earliest_batch_first():
    jobs = Jobs()
    ran: list[tuple[int, int]] = []

    def decode(number: int, position: int) -> None:
        ran.append((number, position))
        if len(ran) == 3:
            assert queue.drop_all() == 20  # the bytes of the two not decoded yet

    queue = DecodeQueue(jobs.submit, max_jobs=1)
    slots = [Slot([0, 1, 2, 3], list, number) for number in range(3)]
    for number, position in [(2, 0), (0, 3), (1, 1), (0, 1), (1, 0)]:
        queue.put(slots[number], position, 10, lambda n=number, p=position: decode(n, p))
    assert len(jobs.queued) == 1  # one job drains them all
    jobs.run_one()
    assert ran == [(0, 1), (0, 3), (1, 0)]
    assert queue.running == 0 and not jobs.queued


def test_a_sample_put_starts_a_job_only_below_the_limit():
    jobs = Jobs()
    queue = DecodeQueue(jobs.submit, max_jobs=2)
    slot = Slot([0, 1, 2, 3], list, 0)
    ran: list[int] = []
    for position in range(4):
        queue.put(slot, position, 1, lambda p=position: ran.append(p))
    assert len(jobs.queued) == 2 and queue.running == 2
    jobs.run_one()  # drains all four
    assert ran == [0, 1, 2, 3]
    jobs.run_one()  # finds the queue empty and ends
    assert queue.running == 0
    queue.put(slot, 0, 1, lambda: ran.append(9))  # a new job again
    assert len(jobs.queued) == 1 and queue.running == 1


class ScriptedTuner:
    """A thread controller that answers each job's end with the next count of a script."""

    def __init__(self, threads: int, script: list[int]) -> None:
        self.threads = threads
        self.script = script
        self.seen: list[bool] = []

    def observe(self, seconds: float, waited: bool) -> int:
        assert seconds >= 0
        self.seen.append(waited)
        self.threads = self.script.pop(0)
        return self.threads


def test_a_tuned_queue_starts_a_job_when_its_threads_grow_and_ends_one_when_they_shrink():
    jobs = Jobs()
    tuner = ScriptedTuner(1, [2, 2, 1, 1, 1, 1])
    queue = DecodeQueue(jobs.submit, max_jobs=9, tuner=tuner)  # type: ignore[arg-type]
    assert queue.max_jobs == 1  # the tuner's count, not max_jobs
    slot = Slot(list(range(6)), list, 0)
    ran: list[int] = []
    for position in range(6):
        queue.put(slot, position, 1, lambda p=position: ran.append(p))
    assert len(jobs.queued) == 1 and queue.running == 1

    # The first job decodes sample 0 and hears 2: a second job is submitted. After sample
    # 2 it hears 1 while two are counted: it ends, and the second drains the rest.
    jobs.run_one()
    assert ran == [0, 1, 2] and queue.running == 1 and len(jobs.queued) == 1
    jobs.run_one()
    assert ran == [0, 1, 2, 3, 4, 5] and queue.running == 0
    assert tuner.seen == [True, True, True, True, True, False]
    assert queue.max_jobs == 1


def test_a_tuned_queue_over_its_count_ends_the_extra_job_after_its_sample():
    jobs = Jobs()
    tuner = ScriptedTuner(2, [1, 1, 1, 1])
    queue = DecodeQueue(jobs.submit, max_jobs=2, tuner=tuner)  # type: ignore[arg-type]
    slot = Slot(list(range(4)), list, 0)
    ran: list[int] = []
    for position in range(4):
        queue.put(slot, position, 1, lambda p=position: ran.append(p))
    assert len(jobs.queued) == 2 and queue.running == 2
    first, second = jobs.queued
    jobs.queued.clear()
    first()  # decodes 0, hears 1 while two run: ends
    assert ran == [0] and queue.running == 1
    second()  # the one left drains the rest
    assert ran == [0, 1, 2, 3] and queue.running == 0


def test_a_job_gives_way_to_a_fork_between_samples():
    jobs = Jobs()
    queue = DecodeQueue(jobs.submit, max_jobs=1, yield_to_fork=lambda: jobs.forking)
    slot = Slot([0, 1, 2], list, 0)
    ran: list[int] = []

    def decode(position: int) -> None:
        ran.append(position)
        jobs.forking = position == 0  # a fork starts while the first sample decodes

    for position in range(3):
        queue.put(slot, position, 1, lambda p=position: decode(p))
    jobs.run_one()
    assert ran == [0]  # the job ended after one sample...
    assert len(jobs.queued) == 1 and queue.running == 1  # ...and handed the rest on
    jobs.forking = False
    jobs.run_one()
    assert ran == [0, 1, 2] and queue.running == 0


def test_a_decode_that_raises_hands_the_rest_on():
    jobs = Jobs()
    queue = DecodeQueue(jobs.submit, max_jobs=1)
    slot = Slot([0, 1], list, 0)
    ran: list[int] = []

    def boom() -> None:
        raise RuntimeError("decode failed outside the pipeline's own handling")

    queue.put(slot, 0, 1, boom)
    queue.put(slot, 1, 1, lambda: ran.append(1))
    with pytest.raises(RuntimeError, match="decode failed"):
        jobs.run_one()
    assert len(jobs.queued) == 1 and queue.running == 1
    jobs.run_one()
    assert ran == [1] and queue.running == 0


def test_a_shut_pool_leaves_no_job_counted():
    jobs = Jobs()
    jobs.shut = True
    queue = DecodeQueue(jobs.submit, max_jobs=1)
    with pytest.raises(RuntimeError):
        queue.put(Slot([0], list, 0), 0, 5, lambda: None)
    assert queue.running == 0
    assert queue.drop_all() == 5


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
    fetch_config = FetchConfig(max_inflight_requests=8)
    dataset: Any = ObjectDataset(store, decode=decode, fetch_config=fetch_config)
    options = PipelineOptions(prefetch_batches=2, decode_threads=1)
    pipeline = BatchPipeline(
        dataset, [[0, 1, 2, 3], [4, 5, 6, 7]], collate_fn=list, options=options
    )
    assert list(pipeline) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    # Only what was decoding when batch 0 arrived comes before it.
    assert decoded.index(3) < decoded.index(7), decoded
