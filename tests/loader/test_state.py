"""Exact resume: the state a loader records, its round trip through ``torch.save``, and a
resumed loader yielding exactly the batches an uninterrupted run would have."""

from __future__ import annotations

import io
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from torch.utils.data import RandomSampler

from concurrent_loader import ConcurrentDataLoader
from concurrent_loader.errors import ConfigError
from concurrent_loader.loader.state import (
    STATE_VERSION,
    EpochProgress,
    GeneratorStates,
    check_version,
    make_state,
    restore,
)
from concurrent_loader.testing.memory import MemoryConfig

COUNT = 30
BATCH = 4  # 8 batches, the last one of 2


def round_trip(state: dict[str, Any]) -> dict[str, Any]:
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return torch.load(buffer)


def draws(generator: torch.Generator) -> list[int]:
    return torch.randperm(10, generator=generator).tolist()


# ---------------------------------------------------------------------------- state values


def test_generator_states_cover_the_loaders_and_the_samplers_generators():
    loader_gen = torch.Generator().manual_seed(1)
    sampler = RandomSampler(range(10), generator=torch.Generator().manual_seed(2))
    states = GeneratorStates(loader_gen, sampler)
    saved = states.get()
    assert set(saved) == {"loader", "sampler"}
    expected = (draws(loader_gen), draws(sampler.generator))
    states.set(saved)
    assert (draws(loader_gen), draws(sampler.generator)) == expected


def test_no_generators_no_states():
    assert GeneratorStates(None, None).get() == {}
    GeneratorStates(None, None).set({"loader": torch.Generator().get_state()})


def test_state_before_any_epoch_starts_the_first():
    generator = torch.Generator().manual_seed(3)
    state = make_state(None, 0, GeneratorStates(generator, None))
    assert state["version"] == STATE_VERSION
    assert (state["epoch"], state["batches_taken"]) == (0, 0)
    assert (state["rank"], state["world_size"]) == (0, 1)
    assert torch.equal(state["generator_states"]["loader"], generator.get_state())


def test_mid_epoch_state_records_the_epochs_start_and_the_batches_taken():
    generator = torch.Generator().manual_seed(4)
    at_start = GeneratorStates(generator, None).get()
    draws(generator)  # the epoch's order was drawn since
    progress = EpochProgress(
        epoch=2, generator_states=at_start, num_batches=8, batches_taken=3, samples=30
    )
    state = round_trip(make_state(progress, 3, GeneratorStates(generator, None)))
    assert (state["epoch"], state["batches_taken"]) == (2, 3)
    replay = torch.Generator()
    assert restore(state, GeneratorStates(replay, None)) == (2, 3)
    assert draws(replay) == draws(torch.Generator().manual_seed(4))


def test_state_after_an_epoch_starts_the_next():
    generator = torch.Generator().manual_seed(5)
    at_start = GeneratorStates(generator, None).get()
    draws(generator)
    progress = EpochProgress(
        epoch=0, generator_states=at_start, num_batches=8, batches_taken=8, samples=30, done=True
    )
    state = round_trip(make_state(progress, 1, GeneratorStates(generator, None)))
    assert (state["epoch"], state["batches_taken"]) == (1, 0)
    replay = torch.Generator()
    restore(state, GeneratorStates(replay, None))
    assert draws(replay) == draws(generator)


def test_unknown_versions_are_refused():
    with pytest.raises(ConfigError, match="version"):
        check_version({"version": STATE_VERSION + 1})
    with pytest.raises(ConfigError):
        check_version({})


def test_a_state_from_another_world_size_is_refused():
    state = make_state(None, 0, GeneratorStates(None, None)) | {"world_size": 2, "rank": 1}
    with pytest.raises(ConfigError, match="world size"):
        restore(state, GeneratorStates(None, None))


# ---------------------------------------------------------------------------- through a loader


def make_loader(helpers, seed: int, store: MemoryConfig | None = None) -> ConcurrentDataLoader:
    store = store or MemoryConfig(
        helpers.numbered_objects(COUNT), script=helpers.jitter(seed, 0.002)
    )
    return helpers.shuffled_loader(store, BATCH, seed, num_workers=0)


@pytest.fixture
def uninterrupted(helpers) -> list[list[list[int]]]:
    loader = make_loader(helpers, seed=10)
    epochs = [list(loader) for _ in range(2)]
    assert epochs[0] != epochs[1]  # shuffled anew each epoch
    assert all(sorted(i for b in epoch for i in b) == list(range(COUNT)) for epoch in epochs)
    return epochs


def take(batches: Iterator[Any], count: int) -> list[Any]:
    return [next(batches) for _ in range(count)]


@pytest.mark.parametrize("taken", [0, 1, 3, 7])
def test_resume_mid_epoch_yields_exactly_the_remaining_batches(helpers, uninterrupted, taken):
    first = make_loader(helpers, seed=10)
    batches = iter(first)
    assert take(batches, taken) == uninterrupted[0][:taken]
    state = round_trip(first.state_dict())
    batches.close()  # the run is interrupted here
    assert (state["epoch"], state["batches_taken"]) == (0, taken)

    store = MemoryConfig(helpers.numbered_objects(COUNT), script=helpers.jitter(1, 0.002))
    resumed = make_loader(helpers, seed=999, store=store)  # another seed: the state decides
    resumed.load_state_dict(state)
    rest = list(resumed)
    assert rest == uninterrupted[0][taken:]
    # only what the consumer had not received is fetched again
    assert store.stats.total == sum(len(b) for b in rest)
    assert list(resumed) == uninterrupted[1]


def test_resume_after_the_last_batch_was_received_starts_the_next_epoch(helpers, uninterrupted):
    first = make_loader(helpers, seed=10)
    batches = iter(first)
    take(batches, len(first))  # every batch, without asking for the end
    state = first.state_dict()
    batches.close()
    resumed = make_loader(helpers, seed=999)
    resumed.load_state_dict(round_trip(state))
    assert list(resumed) == []  # the rest of epoch 0: nothing
    assert list(resumed) == uninterrupted[1]


def test_resume_between_epochs_starts_the_next_epoch(helpers, uninterrupted):
    first = make_loader(helpers, seed=10)
    assert list(first) == uninterrupted[0]
    state = round_trip(first.state_dict())
    assert (state["epoch"], state["batches_taken"]) == (1, 0)
    resumed = make_loader(helpers, seed=999)
    resumed.load_state_dict(state)
    assert list(resumed) == uninterrupted[1]


def test_a_state_from_a_longer_epoch_is_refused(helpers):
    first = make_loader(helpers, seed=10)
    state = first.state_dict() | {"batches_taken": 9}
    resumed = make_loader(helpers, seed=10)
    resumed.load_state_dict(state)
    with pytest.raises(ConfigError, match="8 batches"):
        iter(resumed)


def test_load_state_dict_checks_the_version(helpers):
    loader = make_loader(helpers, seed=10)
    with pytest.raises(ConfigError, match="version"):
        loader.load_state_dict({"version": 0})
