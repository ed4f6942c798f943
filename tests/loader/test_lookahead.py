"""Next-epoch prefetch: predicted batches are fetched while an epoch drains and delivered
only when the next epoch asks for exactly them; otherwise dropped, with nothing left behind.

The pipeline runs in this process on the in-memory store, whose record of GETs per key tells
what was fetched (and so whether a prediction was used or fetched again); samples are
checked by identity (each body starts with its index).
"""

from __future__ import annotations

import random
import time
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import (
    BatchSampler,
    DistributedSampler,
    RandomSampler,
    Sampler,
    SequentialSampler,
)

from concurrent_loader import FetchConfig, HedgeConfig, ObjectDataset, ObjectNotFound
from concurrent_loader.loader import state as resume
from concurrent_loader.loader.lookahead import Feed, Lookahead, predict_next_epoch
from concurrent_loader.pipeline import BatchPipeline, Failure, PipelineOptions
from concurrent_loader.testing.memory import STALL, MemoryConfig

COUNT = 48
BATCH = 4
PREFETCH = 3


def batches_of(seed: int, indices: range = range(COUNT)) -> list[list[int]]:
    order = list(indices)
    random.Random(seed).shuffle(order)
    return [order[i : i + BATCH] for i in range(0, len(order), BATCH)]


def keys_of(helpers: Any, batches: list[list[int]]) -> list[str]:
    return [helpers.key_for(i) for batch in batches for i in batch]


class Setup:
    def __init__(self, helpers: Any, script: Any = None, **fetch: Any) -> None:
        self.store = MemoryConfig(helpers.numbered_objects(COUNT), script=script)
        # Hedging off: the GETs counted in flight are the limit's, not hedges beside them.
        self.dataset = ObjectDataset(
            self.store,
            decode=helpers.index_of,
            fetch_config=FetchConfig(hedge=HedgeConfig(enabled=False), **fetch),
        )
        self.options = PipelineOptions(
            prefetch_batches=PREFETCH, decode_threads=2, stall_timeout_s=20
        )
        self.started: list[BatchPipeline] = []

    def start(self, feed: Feed) -> BatchPipeline:
        pipeline = BatchPipeline(self.dataset, feed, collate_fn=list, options=self.options)
        self.started.append(pipeline)
        return pipeline


def wait_for_gets(store: MemoryConfig, total: int, timeout: float = 5.0) -> bool:
    """Wait until the store was asked for ``total`` GETs in all."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if store.stats.total >= total:
            return True
        time.sleep(0.005)
    return False


# ---------------------------------------------------------------------------- worker side


def test_predicted_batches_are_fetched_during_the_epoch_and_delivered_by_the_next(helpers):
    setup = Setup(helpers)
    ahead = Lookahead()
    first, second = batches_of(1), batches_of(2)
    assert list(ahead.epoch(first, second, setup.start)) == first
    # The epoch ended after exactly its batches; the next epoch's first ones are in progress.
    assert not setup.started[0]._closed
    assert wait_for_gets(setup.store, COUNT + PREFETCH * BATCH)
    assert list(ahead.epoch(second, [], setup.start)) == second
    assert len(setup.started) == 1  # one pipeline for both epochs: the prediction was used
    # Every object was fetched once per epoch: the predicted GETs were not made again.
    assert dict(setup.store.stats.gets) == {helpers.key_for(i): 2 for i in range(COUNT)}
    assert setup.started[0]._closed  # no prediction: nothing kept, the pipeline is closed


def test_a_wrong_prediction_is_dropped_and_never_delivered(helpers):
    setup = Setup(helpers)
    ahead = Lookahead()
    first, predicted, actual = batches_of(1), batches_of(2), batches_of(3)
    assert list(ahead.epoch(first, predicted, setup.start)) == first
    assert wait_for_gets(setup.store, COUNT + PREFETCH * BATCH)
    assert list(ahead.epoch(actual, [], setup.start)) == actual
    assert len(setup.started) == 2  # the prediction was dropped, a new pipeline started
    dropped = setup.started[0]
    assert dropped._closed and not dropped._slots  # its batches and bytes let go
    fetched = len(first) * BATCH + PREFETCH * BATCH + len(actual) * BATCH
    assert setup.store.stats.total == fetched


@pytest.mark.parametrize(
    "change",
    [
        "second batch differs",  # the first predicted batch alone would have been right
        "one index differs",
        "fewer batches",  # the share ends before the predicted batches started
        "resumed",  # a resumed epoch skips its first batches
    ],
)
def test_only_an_exact_prefix_is_used(helpers, change):
    setup = Setup(helpers)
    ahead = Lookahead()
    first, predicted = batches_of(1), batches_of(2)
    actual = [list(batch) for batch in predicted]
    if change == "second batch differs":
        actual[1], actual[5] = actual[5], actual[1]
    elif change == "one index differs":
        actual[2][3], actual[7][0] = actual[7][0], actual[2][3]
    elif change == "fewer batches":
        actual = actual[: PREFETCH - 1]
    else:
        actual = actual[2:]
    assert list(ahead.epoch(first, predicted, setup.start)) == first
    assert list(ahead.epoch(actual, [], setup.start)) == actual
    assert len(setup.started) == 2  # the prediction was dropped, a new pipeline started


def test_prediction_goes_on_epoch_after_epoch(helpers):
    setup = Setup(helpers)
    ahead = Lookahead()
    epochs = [batches_of(seed) for seed in range(5)]
    for number, batches in enumerate(epochs):
        following = epochs[number + 1] if number + 1 < len(epochs) else []
        assert list(ahead.epoch(batches, following, setup.start)) == batches
    assert len(setup.started) == 1  # every prediction used
    assert dict(setup.store.stats.gets) == {helpers.key_for(i): 5 for i in range(COUNT)}


def test_prediction_stays_within_the_window_and_the_requests_limit(helpers):
    # The predicted GETs never answer: the epoch still ends, after exactly its batches.
    first, predicted = batches_of(1, range(COUNT // 2)), batches_of(2, range(COUNT // 2, COUNT))
    predicted_keys = set(keys_of(helpers, predicted[:PREFETCH]))
    setup = Setup(
        helpers,
        script=lambda key, attempt: STALL if key in predicted_keys else 0.002,
        max_inflight_requests=5,
    )
    ahead = Lookahead()
    assert list(ahead.epoch(first, predicted, setup.start)) == first
    assert len(setup.started[0]._slots) == PREFETCH  # prefetch_batches, not more
    assert wait_for_gets(setup.store, COUNT // 2 + 5)
    time.sleep(0.05)
    assert setup.store.stats.max_in_flight <= 5
    assert setup.store.stats.in_flight == 5
    # A wrong guess cancels the GETs that never answer: no hang, nothing left.
    other = batches_of(3, range(COUNT // 2))
    assert list(ahead.epoch(other, [], setup.start)) == other
    assert setup.store.stats.in_flight == 0


def test_closing_drops_what_is_kept(helpers):
    first, predicted = batches_of(1, range(COUNT // 2)), batches_of(2, range(COUNT // 2, COUNT))
    predicted_keys = set(keys_of(helpers, predicted[:PREFETCH]))
    setup = Setup(helpers, script=lambda key, attempt: STALL if key in predicted_keys else None)
    ahead = Lookahead()
    assert list(ahead.epoch(first, predicted, setup.start)) == first
    assert not setup.started[0]._closed
    assert wait_for_gets(setup.store, COUNT // 2 + 1)
    ahead.close()  # the worker ends
    assert setup.store.stats.in_flight == 0
    assert setup.started[0]._closed


def test_an_epoch_left_early_keeps_nothing(helpers):
    setup = Setup(helpers)
    ahead = Lookahead()
    first = batches_of(1)
    epoch = ahead.epoch(first, batches_of(2), setup.start)
    assert [next(epoch), next(epoch)] == first[:2]
    epoch.close()  # ``break`` (torch drops the worker's iterator)
    assert setup.started[0]._closed
    assert list(ahead.epoch(first, [], setup.start)) == first
    assert len(setup.started) == 2  # nothing was kept to use


def test_a_failure_in_a_predicted_batch_is_that_batch_s_outcome(helpers):
    first, predicted = batches_of(1), batches_of(2)
    missing = helpers.key_for(predicted[1][2])
    setup = Setup(
        helpers,
        # Its second GET, the predicted one, fails.
        script=lambda key, attempt: (
            ObjectNotFound("gone", url=f"memory://test/{key}")
            if key == missing and attempt == 1
            else None
        ),
    )
    ahead = Lookahead()
    assert list(ahead.epoch(first, predicted, setup.start)) == first
    outcomes = list(ahead.epoch(predicted, [], setup.start))
    assert len(setup.started) == 1  # the prediction was used
    assert len(outcomes) == len(predicted)
    assert isinstance(outcomes[1], Failure) and isinstance(outcomes[1].exc, ObjectNotFound)
    assert [o for b, o in enumerate(outcomes) if b != 1] == predicted[:1] + predicted[2:]


def test_a_pipeline_that_cannot_start_fails_every_batch_of_the_share(helpers):
    ahead = Lookahead()
    broken = RuntimeError("no client")

    def start(feed: Feed) -> BatchPipeline:
        raise broken

    outcomes = list(ahead.epoch(batches_of(1), batches_of(2), start))
    assert len(outcomes) == COUNT // BATCH
    assert all(isinstance(o, Failure) and o.exc is broken for o in outcomes)
    assert ahead._pipeline is None  # nothing kept


# ---------------------------------------------------------------------------- main process


def _draw(sampler: Any, batched: bool) -> list[list[Any]]:
    return [list(b) for b in sampler] if batched else [[i] for i in sampler]


@pytest.mark.parametrize("batched", [True, False])
@pytest.mark.parametrize("where", ["loader", "sampler"])
def test_the_prediction_is_the_next_draw_and_changes_no_random_state(batched, where):
    generator = torch.Generator().manual_seed(7)
    sampler: Any = RandomSampler(range(40), generator=generator)
    if batched:
        sampler = BatchSampler(sampler, 6, drop_last=False)
    states = resume.GeneratorStates(generator if where == "loader" else None, sampler)
    global_before = torch.get_rng_state()
    predicted = predict_next_epoch(sampler, batched=batched, users=True, generators=states)
    assert torch.equal(torch.get_rng_state(), global_before)
    assert predicted == _draw(sampler, batched)  # drawn from the state put back
    again = predict_next_epoch(sampler, batched=batched, users=True, generators=states)
    assert again == _draw(sampler, batched) and again != predicted


def test_a_user_distributed_sampler_is_predicted_at_its_next_epoch():
    sampler = DistributedSampler(range(40), num_replicas=2, rank=1, shuffle=True, seed=3)
    sampler.set_epoch(4)
    predicted = predict_next_epoch(
        sampler, batched=False, users=True, generators=resume.GeneratorStates(None, sampler)
    )
    assert sampler.epoch == 4  # the user's sampler is not touched
    sampler.set_epoch(5)
    assert predicted == _draw(sampler, False)


class ShuffleWithPythonRandom(Sampler[int]):
    def __iter__(self) -> Any:
        order = list(range(10))
        random.shuffle(order)
        return iter(order)

    def __len__(self) -> int:
        return 10


class MySequential(SequentialSampler):
    pass


@pytest.mark.parametrize(
    "sampler",
    [
        RandomSampler(range(10)),  # torch's global RNG: a training step draws from it too
        ShuffleWithPythonRandom(),
        MySequential(range(10)),  # a subclass may draw from anything
        BatchSampler(RandomSampler(range(10)), 3, drop_last=False),
    ],
    ids=["global RNG", "own sampler", "subclass", "batches of global RNG"],
)
def test_no_prediction_where_the_order_depends_on_state_not_copied(sampler):
    python_state = random.getstate()
    generators = resume.GeneratorStates(None, sampler)
    assert predict_next_epoch(sampler, batched=False, users=True, generators=generators) == []
    assert random.getstate() == python_state


def test_a_sequential_order_is_predicted():
    sampler = BatchSampler(SequentialSampler(range(10)), 4, drop_last=True)
    generators = resume.GeneratorStates(None, sampler)
    assert predict_next_epoch(sampler, batched=True, users=True, generators=generators) == [
        [0, 1, 2, 3],
        [4, 5, 6, 7],
    ]


def test_a_guess_is_the_same_batch_only_with_indices_of_the_same_types():
    feed = Feed([], [[1, 2], [3]])
    assert next(feed) == [1, 2]
    assert feed.follows([[1, 2], [4]])
    assert not feed.follows([[1, 2.0]])
    assert not feed.follows([[True, 2]])
    assert not feed.follows([[np.int64(1), 2]])
    assert not feed.follows([[1]])
    assert not feed.follows([])
    arrays = Feed([], [[np.arange(3)]])
    next(arrays)
    assert not arrays.follows([[np.arange(3)]])  # not known equal: fetched again
