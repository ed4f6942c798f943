"""The loader's tuned choices: ``loader.tuning``, the self-tuned fetch limit and decode
threads carried from one epoch's worker processes to the next and through ``state_dict()``."""

from __future__ import annotations

import time

import pytest

from concurrent_loader import ConcurrentDataLoader, ConfigError, FetchConfig, ObjectDataset
from concurrent_loader.testing.memory import MemoryConfig
from tests.helpers import index_of

COUNT = 3000
BATCH = 32


def _loader(helpers, fetch_config: FetchConfig, **kwargs) -> ConcurrentDataLoader:
    # Latency holds at any load: the self-tuned limit doubles past its start of 64.
    store = MemoryConfig(helpers.numbered_objects(COUNT), latency_s=0.05)
    dataset = ObjectDataset(store, decode=helpers.index_of, fetch_config=fetch_config)
    return ConcurrentDataLoader(dataset, batch_size=BATCH, **kwargs)


def _first_batch(loader: ConcurrentDataLoader, choice: str) -> int:
    """``loader.tuning[choice]`` as the workers reported it with their first batch of an
    epoch (the decode-thread controller decides after half a second at the earliest)."""
    iterator = iter(loader)
    next(iterator)
    value = loader.tuning[choice]
    for _ in iterator:
        pass
    return value


def _first_batch_limit(loader: ConcurrentDataLoader) -> int:
    return _first_batch(loader, "max_inflight_requests")


@pytest.mark.parametrize("num_workers", [0, 1])
def test_the_tuned_limit_carries_to_the_next_epochs_processes_and_through_state(
    helpers, num_workers
):
    loader = _loader(helpers, FetchConfig(), num_workers=num_workers, cpu_budget=4)
    assert loader.tuning == {
        "max_inflight_requests": None,  # nothing tuned yet
        "decode_threads": 4,
        "max_decode_threads": 4,
        "prefetch_batches": 3,  # 64 GETs at first: two batches of 32, plus one
        "follows_fetch_limit": True,
        "busy": {"fetch": 0.0, "decode": 0.0},
    }
    assert list(loader) and loader.tuning["max_inflight_requests"] > 64
    tuned = loader.state_dict()["tuning"]["inflight_limit"]
    assert tuned == loader.tuning["max_inflight_requests"]
    # The next epoch's new worker (or the main process's client) starts where this ended,
    # not at 64 (from which one round could reach 128 at most).
    assert _first_batch_limit(loader) >= min(tuned, 256)

    resumed = _loader(helpers, FetchConfig(), num_workers=num_workers)
    resumed.load_state_dict(loader.state_dict())
    carried = loader.state_dict()["tuning"]["inflight_limit"]
    assert resumed.tuning["max_inflight_requests"] == carried
    assert _first_batch_limit(resumed) >= min(carried, 256)


def test_a_pinned_limit_is_reported_and_carries_nothing(helpers):
    loader = _loader(
        helpers, FetchConfig(max_inflight_requests=128), prefetch_batches=3, decode_threads=3
    )
    assert list(loader)
    tuning = loader.tuning
    assert tuning.pop("busy")["fetch"] > 0
    assert tuning == {
        "max_inflight_requests": 128,
        "decode_threads": 3,
        "max_decode_threads": None,
        "prefetch_batches": 3,
        "follows_fetch_limit": False,
    }
    assert loader.state_dict()["tuning"] == {"inflight_limit": None, "decode_threads": None}


def _first_batch_threads(loader: ConcurrentDataLoader) -> int:
    return _first_batch(loader, "decode_threads")


@pytest.mark.parametrize("num_workers", [0, 1])
def test_tuned_decode_threads_carry_through_state_within_the_budget(helpers, num_workers):
    loader = _loader(helpers, FetchConfig(), num_workers=num_workers, cpu_budget=4)
    state = loader.state_dict()
    assert state["tuning"]["decode_threads"] == 4  # nothing tuned yet: the start
    for carried, expected in ((2, 2), (9, 4)):  # more than this budget allows: its most
        resumed = _loader(helpers, FetchConfig(), num_workers=num_workers, cpu_budget=4)
        resumed.load_state_dict(state | {"tuning": {"decode_threads": carried}})
        assert resumed.tuning["decode_threads"] == expected
        assert _first_batch_threads(resumed) == expected


@pytest.mark.parametrize(
    ("tuning", "message"),
    [
        ({"inflight_limit": 0}, "must be an int >= 1, got 0"),
        ({"inflight_limit": 100.0}, "must be an int >= 1, got 100.0"),
        ({"decode_threads": -1}, r"tuning\['decode_threads'\] must be an int >= 1, got -1"),
        ("fast", "'tuning' must be a dict"),
    ],
)
def test_a_state_with_a_bad_tuning_is_refused_when_loaded(helpers, tuning, message):
    loader = _loader(helpers, FetchConfig())
    state = loader.state_dict() | {"tuning": tuning}
    with pytest.raises(ConfigError, match=message):
        loader.load_state_dict(state)


def test_a_state_without_tuning_loads(helpers):
    loader = _loader(helpers, FetchConfig())
    state = loader.state_dict()
    del state["tuning"]
    loader.load_state_dict(state)
    assert loader.tuning["max_inflight_requests"] is None


def _busy_index_of(data: bytes) -> int:
    time.sleep(0.005)  # decoding sets the pace: no thread idles, none is given back
    return index_of(data)


def test_the_tuning_is_the_mean_of_the_processes_that_published_it(helpers):
    # Two workers of four threads each: after the first batch one of them may not have
    # published yet, and is not counted as zero.
    store = MemoryConfig(helpers.numbered_objects(COUNT), latency_s=0.05)
    dataset = ObjectDataset(store, decode=_busy_index_of)
    loader = ConcurrentDataLoader(dataset, batch_size=BATCH, num_workers=2, cpu_budget=8)
    assert _first_batch_threads(loader) == 4
    assert loader.state_dict()["tuning"]["decode_threads"] == 4


def test_decode_threads_that_idle_are_given_back_not_grown(helpers):
    # Decoding is nearly free here while GETs take 50 ms: samples land in bursts and wait
    # for a thread, yet the threads idle. Over three epochs the count never rises above its
    # start (2 of at most 3) and, carried from epoch to epoch, ends below it.
    loader = _loader(helpers, FetchConfig(max_inflight_requests=64), num_workers=0, cpu_budget=2.5)
    assert (loader.tuning["decode_threads"], loader.tuning["max_decode_threads"]) == (2, 3)
    seen = []
    for _ in range(3):
        for _batch in loader:
            seen.append(loader.tuning["decode_threads"])
    assert max(seen) <= 2 and seen[-1] == 1, seen


def test_auto_workers_are_a_process_per_core_of_the_budget_each_with_one_decode_thread(helpers):
    loader = _loader(helpers, FetchConfig(), num_workers="auto", cpu_budget=2)
    assert loader.num_workers == 2  # torch's meaning from here on: a count
    assert (loader.tuning["decode_threads"], loader.tuning["max_decode_threads"]) == (1, 1)
    assert sorted(int(i) for batch in loader for i in batch) == list(range(COUNT))


def test_auto_workers_with_an_executor_are_refused(helpers):
    with pytest.raises(ConfigError, match="leave num_workers at 0"):
        _loader(helpers, FetchConfig(), num_workers="auto", executor=object())
