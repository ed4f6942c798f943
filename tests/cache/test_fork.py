"""A cache's ``flock`` across ``fork()``: a lock a thread of the parent holds as workers
fork never stalls the workers' own writes (real forked processes, bounded waits).

A ``flock`` belongs to the open file description, which a forked child shares: a child
holding a copy keeps the lock alive after the parent closes its own file, and a child
taking the lock through the copy is not excluded by the parent's. A thread lock held by a
thread of the parent at the fork stays held in the child for good (the thread is not
there to release it).
"""

from __future__ import annotations

import fcntl
import multiprocessing
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from concurrent_loader import ConcurrentDataLoader, ObjectDataset
from concurrent_loader.cache import CacheConfig, clear_cache
from concurrent_loader.cache.directory import CacheDirectory, name_for
from concurrent_loader.cache.layout import data_checksum, footer
from concurrent_loader.testing.memory import MemoryConfig

from ._entries import read_entry
from .conftest import index_of, numbered_objects

WAIT_S = 30


def _put(directory: CacheDirectory, source: str) -> None:
    data = source.encode() * 10
    tail = footer(len(data), data_checksum(data), None, source)
    if not directory.put(name_for(source), data, tail, replace=False):
        raise SystemExit(3)


def _put_in_new_directory(config: CacheConfig, source: str) -> None:
    directory = CacheDirectory(config)
    try:
        _put(directory, source)
    finally:
        directory.close()


@pytest.fixture
def config(cache_dir: Path) -> CacheConfig:
    config = CacheConfig(str(cache_dir), max_bytes=1_000_000).resolved()
    CacheDirectory(config).close()
    return config


@pytest.fixture
def hold_in_thread(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., threading.Event]]:
    """``hold_in_thread(fn, *args)``: run ``fn`` on a thread that stops right after it took
    an exclusive ``flock``; returns the event that lets it go on (set at teardown anyway)."""
    real_flock = fcntl.flock
    holders: set[int] = set()
    locked, release = threading.Event(), threading.Event()

    def flock(fd: int, operation: int) -> None:
        real_flock(fd, operation)
        if operation == fcntl.LOCK_EX and threading.get_ident() in holders:
            locked.set()
            release.wait(WAIT_S)

    monkeypatch.setattr(fcntl, "flock", flock)
    threads: list[threading.Thread] = []

    def start(fn: Callable[..., Any], *args: Any) -> threading.Event:
        def run() -> None:
            holders.add(threading.get_ident())
            fn(*args)

        thread = threading.Thread(target=run)
        thread.start()
        threads.append(thread)
        assert locked.wait(WAIT_S)
        return release

    yield start
    release.set()
    for thread in threads:
        thread.join(WAIT_S)


def _run_forked(
    target: Callable[..., None], args: list[tuple[Any, ...]], release: threading.Event
) -> list[int | None]:
    """Fork one process per ``args`` while the lock is held, then let it go; their exit
    codes (None: still stalled after ``WAIT_S``)."""
    context = multiprocessing.get_context("fork")
    workers = [context.Process(target=target, args=a) for a in args]
    for worker in workers:
        worker.start()
    release.set()
    codes = []
    for worker in workers:
        worker.join(WAIT_S)
        codes.append(worker.exitcode)
        if worker.is_alive():
            worker.kill()
            worker.join()
    return codes


def test_workers_forked_while_a_thread_clears_the_cache_still_write(config, hold_in_thread):
    release = hold_in_thread(clear_cache, config.directory)
    sources = [f"s3://b/worker-{i}" for i in range(2)]
    codes = _run_forked(_put_in_new_directory, [(config, s) for s in sources], release)
    assert codes == [0, 0]
    for source in sources:
        path = Path(config.directory) / "entries" / name_for(source)[:2] / name_for(source)
        assert read_entry(str(path), source) is not None


def test_a_child_using_its_parents_directory_while_a_parent_thread_holds_the_ledger(
    config, hold_in_thread
):
    directory = CacheDirectory(config)
    try:
        release = hold_in_thread(directory.record_reads, 1, 0, 10)
        sources = [f"s3://b/child-{i}" for i in range(2)]
        codes = _run_forked(_put, [(directory, s) for s in sources], release)
        assert codes == [0, 0]
        _put(directory, "s3://b/parent")  # the parent's own files still work
    finally:
        directory.close()
    for source in [*sources, "s3://b/parent"]:
        path = Path(config.directory) / "entries" / name_for(source)[:2] / name_for(source)
        assert read_entry(str(path), source) is not None


@pytest.mark.timeout(90)
def test_a_loader_forking_workers_while_a_thread_clears_the_cache_ends_its_epochs(
    config, hold_in_thread
):
    objects = numbered_objects(32)
    dataset = ObjectDataset(MemoryConfig(objects), decode=index_of, cache=config)
    loader = ConcurrentDataLoader(
        dataset, batch_size=8, num_workers=2, multiprocessing_context="fork"
    )
    release = hold_in_thread(clear_cache, config.directory)
    batches = iter(loader)  # the workers fork now, the clear holding the ledger's lock
    got = next(batches).tolist()
    release.set()
    got += [i for batch in batches for i in batch.tolist()]
    assert sorted(got) == list(range(32))
    assert sorted(i for batch in loader for i in batch.tolist()) == list(range(32))
    assert loader.stats()["cache_hits"] == 32
