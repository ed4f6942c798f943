"""What the main process does as workers start: the heap is frozen for the garbage collector
while they fork, so a worker never finalises the main process's garbage."""

from __future__ import annotations

import gc
import multiprocessing
import os
from collections.abc import Iterator
from typing import Any

import pytest

from concurrent_loader import ConcurrentDataLoader
from concurrent_loader.loader.starting import frozen_heap


@pytest.fixture
def no_automatic_collection() -> Iterator[None]:
    """The collector stays on but collects only when asked, so garbage made by a test is
    still there when the test forks."""
    thresholds = gc.get_threshold()
    gc.set_threshold(10**9)
    try:
        yield
    finally:
        gc.set_threshold(*thresholds)


def test_the_heap_is_frozen_only_meanwhile():
    assert gc.get_freeze_count() == 0
    with frozen_heap():
        assert gc.get_freeze_count() > 0
    assert gc.get_freeze_count() == 0


def test_a_heap_the_program_froze_stays_frozen():
    gc.freeze()
    try:
        frozen = gc.get_freeze_count()
        with frozen_heap():
            pass
        assert gc.get_freeze_count() == frozen
    finally:
        gc.unfreeze()


class _Cycle:
    """Garbage in a reference cycle whose finaliser reports the process that ran it."""

    def __init__(self, report: Any) -> None:
        self.me = self
        self.report = report

    def __del__(self) -> None:
        self.report.send(os.getpid())


def _collect(worker_id: int) -> None:
    gc.collect()


def test_a_worker_never_finalises_the_main_process_s_garbage(no_automatic_collection):
    receive, send = multiprocessing.Pipe(duplex=False)
    _Cycle(send)  # garbage now, collected by no one yet
    loader = ConcurrentDataLoader(
        list(range(8)),
        batch_size=4,
        num_workers=1,
        multiprocessing_context="fork",
        worker_init_fn=_collect,  # the worker collects everything it can
    )
    try:
        assert [b.tolist() for b in loader] == [[0, 1, 2, 3], [4, 5, 6, 7]]
        assert not receive.poll(0), f"finalised in pid {receive.recv()}"
        gc.collect()  # the main process's own collection still finalises it, here
        assert receive.poll(5) and receive.recv() == os.getpid()
    finally:
        receive.close()
        send.close()
