"""The main process's head start on the next epoch (``loader/headstart.py``), on the
in-memory store, in the main process (``num_workers=0``): what it fetches ahead, that a
changed plan still gets exactly its own samples, and that nothing runs on between epochs."""

from __future__ import annotations

import time
from collections import Counter

import torch
from torch.utils.data import DataLoader

from concurrent_loader import ConcurrentDataLoader
from concurrent_loader.stores import MemoryConfig

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
