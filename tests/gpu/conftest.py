"""Fixtures shared by the GPU-stage tests."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

PRODUCER_THREAD_NAME = "concurrent-loader-prefetch"


@pytest.fixture
def no_new_threads() -> Iterator[None]:
    """Fail if the test leaves a thread running that was not there before it.

    The prefetcher joins its producer thread before ``close()`` returns, so a producer
    still alive at the end of the test is a failure at once. Threads of other libraries
    (the feeder threads of a DataLoader's worker queues, which exit shortly after their
    queue is closed) get a few seconds to finish.
    """
    before = set(threading.enumerate())
    yield
    leftover = [t for t in threading.enumerate() if t not in before]
    producers = [t for t in leftover if t.name == PRODUCER_THREAD_NAME]
    assert not producers, f"producer threads left running: {producers}"
    for thread in leftover:
        thread.join(timeout=5)
    alive = [t for t in leftover if t.is_alive()]
    assert not alive, f"threads left running: {alive}"
