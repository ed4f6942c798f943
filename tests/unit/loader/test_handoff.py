"""The handoff (``loader/handoff.py``) on the in-memory store, with two workers started by
``fork`` and no persistent workers: each epoch's workers fetch the next epoch's first
batches for the next epoch's new workers; a changed plan, a GET that fails or stalls there,
and an epoch left early still give exactly the samples asked for, and nothing runs on."""

from __future__ import annotations

import multiprocessing
import time
from collections import Counter
from pathlib import Path

import pytest
import torch
from _forking import fork_warning
from test_headstart import BATCH, COUNT, PREFETCH, forked_loader, stock_epochs
from torch.utils.data import DataLoader, RandomSampler

from concurrent_loader import ConcurrentDataLoader, ObjectDataset
from concurrent_loader.errors import ObjectNotFound, Reason
from concurrent_loader.stores import STALL, MemoryConfig

pytestmark = fork_warning

AHEAD = 2 * PREFETCH  # batches handed off: the first PREFETCH of each of the two workers
DRAWS = 24  # samples per epoch of the sampler with replacement (COUNT objects)


def paced(loader) -> tuple[list[list[int]], int]:
    """An epoch consumed as a training step would, and the GETs its workers sent for it
    (the handoff's GETs, for the next epoch, are not counted)."""
    before = loader.stats()["requests"]
    batches = []
    for batch in loader:
        batches.append(batch)
        time.sleep(0.02)
    return batches, loader.stats()["requests"] - before


def no_children_within(seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while multiprocessing.active_children() and time.monotonic() < deadline:
        time.sleep(0.02)
    return not multiprocessing.active_children()


def test_the_next_epochs_first_batches_come_from_this_epochs_workers(helpers):
    # Every GET takes as long: the first epoch's relay gives none up to the workers.
    store = MemoryConfig(helpers.numbered_objects(COUNT), latency_s=0.01)
    loader = forked_loader(helpers, store, seed=20)
    want = stock_epochs(20, 3)
    assert paced(loader) == (want[0], COUNT - 2 * BATCH)  # the first: each worker's first relayed
    # The main process sent the first epoch's relayed GETs only; none for the next epochs.
    mains = Counter(helpers.key_for(i) for b in want[0][:2] for i in b)
    assert paced(loader) == (want[1], COUNT - AHEAD * BATCH)
    assert paced(loader) == (want[2], COUNT - AHEAD * BATCH)
    assert store.stats.gets == mains


def test_a_changed_plan_gets_exactly_its_own_samples(helpers):
    store = MemoryConfig(helpers.numbered_objects(COUNT), script=helpers.jitter(21, 0.002))
    loader = forked_loader(helpers, store, seed=21)
    want = stock_epochs(21, 2, reseed_before=1)
    assert paced(loader)[0] == want[0]
    loader.generator.manual_seed(22)  # the handed-off batches are not the next epoch's
    # Only bodies of objects that the new first batches read too are used (by chance: the
    # predicted batches were drawn from the other seed).
    handed = {i for b in stock_epochs(21, 2)[1][:AHEAD] for i in b}
    used = handed & {i for b in want[1][:AHEAD] for i in b}
    assert used, "seed without such an object: choose another"
    assert paced(loader) == (want[1], COUNT - len(used))


def test_workers_claiming_batches_hand_off_too(helpers):
    store = MemoryConfig(helpers.numbered_objects(COUNT), latency_s=0.01)
    loader = forked_loader(helpers, store, seed=23, in_order=False)
    want = stock_epochs(23, 2)
    for epoch, requests in enumerate([COUNT - 2 * BATCH, COUNT - AHEAD * BATCH]):
        batches, sent = paced(loader)
        assert sorted(map(sorted, batches)) == sorted(map(sorted, want[epoch]))
        assert sent == requests


# ------------------------------------------------------------------ GETs that fail or stall


def with_replacement(seed: int) -> RandomSampler:
    generator = torch.Generator().manual_seed(seed)
    return RandomSampler(range(COUNT), replacement=True, num_samples=DRAWS, generator=generator)


def drawn_with_replacement(seed: int, epochs: int) -> list[list[list[int]]]:
    """The batches of a sampler with replacement: each epoch draws other objects."""
    stock = DataLoader(range(COUNT), batch_size=BATCH, sampler=with_replacement(seed))  # type: ignore[arg-type]
    return [[b.tolist() for b in stock] for _ in range(epochs)]


def only_in_the_second_epoch(seed: int) -> tuple[list[list[list[int]]], int]:
    """The epochs, and an object among the second epoch's first batches that the first epoch
    does not read: the handoff is the only GET of it before the second epoch."""
    want = drawn_with_replacement(seed, 2)
    first = {i for b in want[0] for i in b}
    ahead = [i for b in want[1][:AHEAD] for i in b if i not in first]
    assert ahead, "seed without such an object: choose another"
    return want, ahead[0]


def sent_by_workers(batches: list[list[int]], handed: set[int]) -> int:
    """The GETs two workers send for ``batches`` given the bodies of ``handed``: each worker
    has its own copy of them, and uses each body once (an object drawn again is read again)."""
    sent = 0
    for worker in range(2):
        used: set[int] = set()
        for index in (i for b in batches[worker::2] for i in b):
            if index in handed and index not in used:
                used.add(index)
            else:
                sent += 1
    return sent


def replacement_loader(helpers, store: MemoryConfig, seed: int) -> ConcurrentDataLoader:
    return ConcurrentDataLoader(
        ObjectDataset(store, decode=helpers.index_of, fetch_config=helpers.unhedged()),
        batch_size=BATCH,
        sampler=with_replacement(seed),
        collate_fn=list,
        num_workers=2,
        multiprocessing_context="fork",
        prefetch_batches=PREFETCH,
        head_start=True,
    )


@pytest.mark.parametrize("fault", ["fails", "stalls"])
def test_a_handoff_get_that_fails_or_stalls_is_the_next_workers_to_fetch(helpers, tmp_path, fault):
    want, target = only_in_the_second_epoch(30)
    served = tmp_path / "served"  # until it exists, the target's GETs fail (or stall)

    def script(key: str, attempt: int) -> object:
        if key != helpers.key_for(target) or served.exists():
            return 0.002
        if fault == "stalls":
            return STALL
        return ObjectNotFound("no such object", url=key, stage="fetch", cause=Reason.NOT_FOUND)

    store = MemoryConfig(helpers.numbered_objects(COUNT), script=script)
    loader = replacement_loader(helpers, store, seed=30)
    began = time.monotonic()
    batches, _ = paced(loader)
    assert batches == want[0]
    # A GET of the handoff that stalls holds no epoch's end.
    assert time.monotonic() - began < 5.0
    Path(served).touch()
    # The second epoch's workers fetched the target themselves, and what was handed off not.
    handed = {i for b in want[1][:AHEAD] for i in b} - {target}
    assert paced(loader) == (want[1], sent_by_workers(want[1], handed))
    assert no_children_within(5.0)


def test_an_epoch_left_early_leaves_nothing_running(helpers):
    store = MemoryConfig(helpers.numbered_objects(COUNT), script=helpers.jitter(24, 0.05))
    loader = forked_loader(helpers, store, seed=24)
    want = stock_epochs(24, 3)
    for i, _ in enumerate(loader):  # every GET is slow: the handoff is in flight here
        if i == len(loader) - 1:
            break
    del _
    assert no_children_within(10.0)
    assert paced(loader)[0] == want[1]
    assert paced(loader)[0] == want[2]
