"""Helpers of the tests of the loader's own logic on the in-memory store, no server, and
their fixtures (``helpers``; ``no_loader_threads_left``, autouse where a ``conftest.py``
imports it).

Every object body written by :func:`numbered_objects` starts with its index, so a decoded
sample names the object it came from and a test can check item identity, not just counts.
Latencies are drawn per ``(key, attempt)`` from a seeded hash, so a run's completion order
does not depend on the order in which the event loop happens to ask.

The autouse fixture checks that a test leaves none of the loader's threads (the runtime's
event loop, decode and ``__getitem__`` pools) running: closing is part of every contract
tested with it.
"""

from __future__ import annotations

import contextlib
import gc
import http.server
import random
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from concurrent_loader import FetchConfig, HedgeConfig, RetryConfig, finish

DIGITS = 6


def key_for(index: int) -> str:
    """The key of object ``index``: keys sort in index order, as a listing returns them."""
    return f"{index:05d}.bin"


def body_for(index: int, size: int = 16) -> bytes:
    """``size`` bytes (at least ``DIGITS``) starting with ``index``."""
    return f"{index:0{DIGITS}d}".encode().ljust(size, b".")


def index_of(data: bytes | bytearray) -> int:
    """The index a body of :func:`body_for` was written for (a decode function)."""
    return int(bytes(data[:DIGITS]))


def numbered_objects(count: int, size: int | Callable[[int], int] = 16) -> dict[str, bytes]:
    """``count`` objects, ``key_for(i)`` -> ``body_for(i, size)`` (``size(i)`` if callable)."""
    return {key_for(i): body_for(i, size(i) if callable(size) else size) for i in range(count)}


def jitter(seed: int, max_s: float) -> Callable[[str, int], float]:
    """A store script: each GET answers after a seeded random delay in ``[0, max_s)``."""

    def script(key: str, attempt: int) -> float:
        return random.Random(f"{seed}/{key}/{attempt}").uniform(0.0, max_s)

    return script


def unhedged() -> FetchConfig:
    """The default fetch config without hedging, for tests that count GETs exactly: on a busy
    machine a GET can outlast the hedge delay, and its hedge is one more GET (in a slot of
    its own, beyond the limit)."""
    return FetchConfig(hedge=HedgeConfig(enabled=False))


@contextlib.contextmanager
def serve_http(handler: type[http.server.BaseHTTPRequestHandler]) -> Iterator[str]:
    """``handler`` served on a loopback port by threads, for as long as the block runs; its
    base URL."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def no_backoff(**retry: Any) -> FetchConfig:
    """A fetch config for exact attempt counts: retries do not sleep (``base_delay=0``),
    and there are no hedges."""
    return FetchConfig(retry=RetryConfig(base_delay=0.0, **retry), hedge=HedgeConfig(enabled=False))


def shuffled_loader(store: Any, batch_size: int, seed: int, **kwargs: Any) -> Any:
    """A ``ConcurrentDataLoader`` over ``store``'s numbered objects, unhedged, shuffled by a
    generator seeded with ``seed``; each batch is the list of its samples' indices."""
    import torch

    from concurrent_loader import ConcurrentDataLoader, ObjectDataset

    return ConcurrentDataLoader(
        ObjectDataset(store, decode=index_of, fetch_config=unhedged()),
        batch_size=batch_size,
        shuffle=True,
        generator=torch.Generator().manual_seed(seed),
        collate_fn=list,
        **kwargs,
    )


def loader_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("concurrent-loader")]


class Helpers:
    """The helpers above, handed to tests by the ``helpers`` fixture."""

    key_for = staticmethod(key_for)
    body_for = staticmethod(body_for)
    index_of = staticmethod(index_of)
    numbered_objects = staticmethod(numbered_objects)
    jitter = staticmethod(jitter)
    no_backoff = staticmethod(no_backoff)
    unhedged = staticmethod(unhedged)
    loader_threads = staticmethod(loader_threads)
    shuffled_loader = staticmethod(shuffled_loader)


@pytest.fixture
def helpers() -> type[Helpers]:
    return Helpers


@pytest.fixture(autouse=True)
def no_loader_threads_left() -> Iterator[None]:
    yield from threads_checked()


def threads_checked() -> Iterator[None]:
    """The check around one test (a generator for a fixture to ``yield from``)."""
    # The process's runtime (and the stores it keeps open) lives while any lease is held: a
    # dataset an earlier test never closed holds one until it is collected. Collect it
    # first, so that what is left after the test is the test's own.
    if loader_threads():
        gc.collect()
        finish.wait()  # what the collected objects' finalizers left
        for thread in loader_threads():
            if thread.name == finish.THREAD_NAME:
                thread.join(5.0)
    before = set(loader_threads())
    yield
    # A closed store's writer may still be finishing its last entry, and a finalizer's work
    # may start a thread to finish it: give new threads a bounded moment to end, then fail
    # on any still running.
    deadline = time.monotonic() + 5.0
    while (new := [t for t in loader_threads() if t not in before]) and (
        time.monotonic() < deadline
    ):
        for thread in new:
            if thread.ident is None:  # still starting
                time.sleep(0.001)
            else:
                thread.join(max(0.0, deadline - time.monotonic()))
    left = [t.name for t in new]
    assert not left, f"threads still running after the test: {left}"
