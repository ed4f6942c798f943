"""The main process's head start (``loader/headstart.py``) on the in-memory store: on the
next epoch, in the main process (``num_workers=0``): what it fetches ahead, that a changed
plan still gets exactly its own samples, and that nothing runs on between epochs; on the
first epoch of forked workers: each worker's first batch, relayed to the workers
(``loader/relay.py``)."""

from __future__ import annotations

import os
import time
from collections import Counter

import pytest
import torch
from _forking import fork_warning
from torch.utils.data import DataLoader

from concurrent_loader import ConcurrentDataLoader
from concurrent_loader.errors import ObjectNotFound, Reason
from concurrent_loader.loader.relay import WAIT_S
from concurrent_loader.stores import STALL, MemoryConfig

COUNT, BATCH, PREFETCH = 40, 4, 2


def stock_epochs(seed: int, epochs: int, reseed_before: int | None = None) -> list[list[list[int]]]:
    """A stock DataLoader's epochs over the same indices (its generator reseeded with
    ``seed + 1`` before epoch ``reseed_before``)."""
    generator = torch.Generator().manual_seed(seed)
    stock = DataLoader(range(COUNT), batch_size=BATCH, shuffle=True, generator=generator)  # type: ignore[arg-type]
    found = []
    for epoch in range(epochs):
        if epoch == reseed_before:
            generator.manual_seed(seed + 1)
        found.append([b.tolist() for b in stock])
    return found


def make_loader(helpers, store: MemoryConfig, seed: int, **kwargs) -> ConcurrentDataLoader:
    kwargs.setdefault("head_start", True)
    return helpers.shuffled_loader(store, BATCH, seed, prefetch_batches=PREFETCH, **kwargs)


def forked_loader(helpers, store: MemoryConfig, seed: int, **kwargs) -> ConcurrentDataLoader:
    """:func:`make_loader` with two workers started by ``fork``."""
    return make_loader(
        helpers, store, seed, num_workers=2, multiprocessing_context="fork", **kwargs
    )


def slowly(loader: ConcurrentDataLoader) -> list[list[int]]:
    """An epoch consumed as a training step would: with time between batches."""
    batches = []
    for batch in loader:
        batches.append(batch)
        time.sleep(0.02)
    return batches


def no_loader_threads_within(helpers, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while helpers.loader_threads() and time.monotonic() < deadline:
        time.sleep(0.02)
    return not helpers.loader_threads()


def test_the_next_epochs_first_batches_are_fetched_ahead_and_not_again(helpers):
    store = MemoryConfig(helpers.numbered_objects(COUNT), script=helpers.jitter(3, 0.002))
    loader = make_loader(helpers, store, seed=5)
    want = stock_epochs(5, 2)
    assert slowly(loader) == want[0]
    after_first = Counter(store.stats.gets)
    ahead = [helpers.key_for(i) for batch in want[1][:PREFETCH] for i in batch]
    # While epoch 0 ended: exactly the next epoch's first PREFETCH batches, once each.
    assert after_first - Counter(helpers.key_for(i) for i in range(COUNT)) == Counter(ahead)
    assert list(loader) == want[1]
    # Epoch 1 read its first batches from memory: it sent GETs for the others only (and,
    # ahead of epoch 2, for at most epoch 2's first batches).
    during_second = Counter(store.stats.gets) - after_first
    next_ahead = stock_epochs(5, 3)[2][:PREFETCH]
    helpers.fetched_once_and_ahead(during_second, want[1][PREFETCH:], next_ahead)


def test_a_changed_plan_gets_exactly_its_own_samples(helpers):
    store = MemoryConfig(helpers.numbered_objects(COUNT), script=helpers.jitter(4, 0.002))
    loader = make_loader(helpers, store, seed=6)
    want = stock_epochs(6, 2, reseed_before=1)
    assert slowly(loader) == want[0]
    loader.generator.manual_seed(7)  # the predicted plan of epoch 1 is now wrong
    assert list(loader) == want[1]  # index_of checks every body is its own key's


def test_turned_off_nothing_is_fetched_ahead(helpers):
    store = MemoryConfig(helpers.numbered_objects(COUNT), script=helpers.jitter(5, 0.002))
    loader = make_loader(helpers, store, seed=7, head_start=False)
    slowly(loader)
    assert store.stats.gets == Counter(helpers.key_for(i) for i in range(COUNT))


def test_nothing_runs_on_after_an_epoch_or_a_break(helpers):
    store = MemoryConfig(helpers.numbered_objects(COUNT), script=helpers.jitter(6, 0.05))
    loader = make_loader(helpers, store, seed=8)
    slowly(loader)
    assert no_loader_threads_within(helpers, 5.0)  # the head start stopped with its epoch
    for i, _ in enumerate(loader):  # every GET is slow: the head start is in flight here
        if i == len(loader) - 1:
            break
    del _
    assert no_loader_threads_within(helpers, 5.0)  # its iterator was collected: stopped
    assert list(loader) == stock_epochs(8, 3)[2]


# ---------------------------------------------------------------------------- the first epoch


@fork_warning
@pytest.mark.parametrize("persistent", [False, True])
def test_the_first_epoch_relays_each_workers_first_batch(helpers, persistent):
    # Every GET takes as long: none is so far behind the others that the main process gives
    # it up to the workers.
    store = MemoryConfig(helpers.numbered_objects(COUNT), latency_s=0.05)
    loader = forked_loader(
        helpers, store, seed=9, persistent_workers=persistent, prefetch_next_epoch=False
    )
    want = stock_epochs(9, 2)
    epoch = iter(loader)
    got = []
    for batch in epoch:  # paced as a training step: the next epoch's head start has time
        got.append(batch)
        time.sleep(0.02)
    assert got == want[0]  # index_of checks every body is its own key's
    # GETs counted here are the main process's own (the workers count theirs in their own
    # memory): the first batch of each of the two workers and, without persistent workers,
    # the next epoch's head start (the first two batches of each worker).
    mains = want[0][:2] + ([] if persistent else want[1][: 2 * PREFETCH])
    assert store.stats.gets == Counter(helpers.key_for(i) for b in mains for i in b)
    assert loader.stats()["requests"] == COUNT - 2 * BATCH  # the workers GET the rest only
    second = list(loader)
    if persistent:  # torch draws no new base seed for persistent workers: another order
        assert sorted(i for b in second for i in b) == list(range(COUNT))
    else:
        assert second == want[1]


@fork_warning
def test_turned_off_the_first_epoch_is_not_fetched_ahead(helpers):
    store = MemoryConfig(helpers.numbered_objects(COUNT), script=helpers.jitter(10, 0.002))
    loader = forked_loader(helpers, store, seed=10, head_start=False)
    epoch = iter(loader)
    assert store.stats.total == 0
    assert list(epoch) == stock_epochs(10, 1)[0]
    assert loader.stats()["requests"] == COUNT


def in_main_process_only(script, main_pid: int):
    """``script`` in the main process; the workers' GETs answer at once."""

    def scripted(key: str, attempt: int) -> object:
        return script(key, attempt) if os.getpid() == main_pid else None

    return scripted


@fork_warning
def test_a_relayed_get_that_fails_is_the_workers_to_fetch(helpers):
    failing = helpers.key_for(stock_epochs(11, 1)[0][1][2])  # in the second worker's first batch

    def script(key: str, attempt: int) -> object:
        if key == failing:
            return ObjectNotFound("no such object", url=key, stage="fetch", cause=Reason.NOT_FOUND)
        return 0.01

    store = MemoryConfig(
        helpers.numbered_objects(COUNT), script=in_main_process_only(script, os.getpid())
    )
    loader = forked_loader(helpers, store, seed=11)
    assert list(loader) == stock_epochs(11, 1)[0]
    assert loader.stats()["requests"] == COUNT - 2 * BATCH + 1  # it, and what was not relayed


@fork_warning
def test_a_relayed_get_that_stalls_holds_no_worker(helpers):
    stalled = helpers.key_for(stock_epochs(12, 1)[0][0][1])  # in the first worker's first batch

    def script(key: str, attempt: int) -> object:
        return STALL if key == stalled else 0.01

    store = MemoryConfig(
        helpers.numbered_objects(COUNT), script=in_main_process_only(script, os.getpid())
    )
    loader = forked_loader(helpers, store, seed=12)
    began = time.monotonic()
    assert list(loader) == stock_epochs(12, 1)[0]
    # Once the others were in, the main process gave up on it (as long again: tens of ms)
    # and the worker fetched it; far below a worker's own wait of relay.WAIT_S.
    assert time.monotonic() - began < WAIT_S / 3
    assert loader.stats()["requests"] == COUNT - 2 * BATCH + 1
    assert no_loader_threads_within(helpers, 5.0)


@fork_warning
def test_the_relay_leaves_no_descriptor_open(helpers):
    def opened_by_an_epoch(head_start: bool) -> int:
        """Descriptors the main process holds after a first epoch of persistent workers."""
        store = MemoryConfig(helpers.numbered_objects(COUNT), latency_s=0.01)
        loader = forked_loader(
            helpers,
            store,
            seed=13,
            persistent_workers=True,
            prefetch_next_epoch=False,
            head_start=head_start,
        )
        before = set(os.listdir("/proc/self/fd"))
        for _ in loader:
            pass
        relayed = COUNT - loader.stats()["requests"]
        assert relayed == (2 * BATCH if head_start else 0)
        assert no_loader_threads_within(helpers, 5.0)
        opened = len(set(os.listdir("/proc/self/fd")) - before)
        del loader  # its persistent workers go
        return opened

    # As many as torch's own for the same loader without a relay: its pipes are closed.
    assert opened_by_an_epoch(head_start=True) == opened_by_an_epoch(head_start=False)
