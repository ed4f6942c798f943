"""ConcurrentDataLoader over the in-memory store: the sampler's batches, in order, each
sample once; errors with their type and object; the skip policy and its budget.

``num_workers=0`` everywhere except two tests that check what crosses worker processes.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
import torch
from _forking import fork_warning
from torch.utils.data import DataLoader, Dataset, IterableDataset

from concurrent_loader import (
    AccessDenied,
    ConcurrentDataLoader,
    ConfigError,
    DecodeError,
    FetchConfig,
    HedgeConfig,
    ObjectDataset,
    PartialList,
    Reason,
    SkipBudgetExceeded,
    SkippedSample,
    is_partial,
)
from concurrent_loader.testing.memory import MemoryConfig

COUNT = 50


def sampler_batches(seed: int | None, batch_size: int, drop_last: bool) -> list[list[int]]:
    """What a stock DataLoader yields for the same arguments."""
    stock = DataLoader(
        range(COUNT),  # type: ignore[arg-type]
        batch_size=batch_size,
        shuffle=seed is not None,
        generator=torch.Generator().manual_seed(seed) if seed is not None else None,
        drop_last=drop_last,
        collate_fn=list,
    )
    return list(stock)


def denying(bad: set[str]) -> Callable[[str, int], object]:
    def script(key: str, attempt: int) -> object:
        if key in bad:
            return AccessDenied("no", url=f"memory://test/{key}", cause=Reason.ACCESS_DENIED)
        return None

    return script


@pytest.mark.parametrize(
    ("batch_size", "drop_last", "prefetch_batches", "max_inflight_requests"),
    [(1, False, 2, 1), (3, False, 3, 4), (7, True, 2, 16), (8, False, 5, 64), (16, True, 2, 8)],
)
@pytest.mark.parametrize("seed", [None, 21])
def test_batches_are_the_samplers_in_order_each_sample_once(
    helpers, seed, batch_size, drop_last, prefetch_batches, max_inflight_requests
):
    store = MemoryConfig(helpers.numbered_objects(COUNT), script=helpers.jitter(7, 0.003))
    fetch_config = FetchConfig(
        max_inflight_requests=max_inflight_requests, hedge=HedgeConfig(enabled=False)
    )
    loader = ConcurrentDataLoader(
        ObjectDataset(store, decode=helpers.index_of, fetch_config=fetch_config),
        batch_size=batch_size,
        shuffle=seed is not None,
        generator=torch.Generator().manual_seed(seed) if seed is not None else None,
        drop_last=drop_last,
        collate_fn=list,
        prefetch_batches=prefetch_batches,
    )
    expected = sampler_batches(seed, batch_size, drop_last)
    assert len(loader) == len(expected)
    assert list(loader) == expected
    planned = [i for b in expected for i in b]
    assert store.stats.gets == Counter(helpers.key_for(i) for i in planned)
    assert store.stats.max_in_flight <= max_inflight_requests


def test_default_collate_stacks_samples(helpers):
    store = MemoryConfig(helpers.numbered_objects(10))
    loader = ConcurrentDataLoader(ObjectDataset(store, decode=helpers.index_of), batch_size=4)
    batches = list(loader)
    assert [b.tolist() for b in batches] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert all(isinstance(b, torch.Tensor) for b in batches)


def test_batch_size_none_yields_single_samples(helpers):
    store = MemoryConfig(helpers.numbered_objects(5))
    loader = ConcurrentDataLoader(ObjectDataset(store, decode=helpers.index_of), batch_size=None)
    assert [int(x) for x in loader] == [0, 1, 2, 3, 4]


def test_a_user_batch_sampler_is_followed(helpers):
    store = MemoryConfig(helpers.numbered_objects(10))
    plan = [[9, 0], [5], [1, 2, 3]]
    loader = ConcurrentDataLoader(
        ObjectDataset(store, decode=helpers.index_of), batch_sampler=plan, collate_fn=list
    )
    assert list(loader) == plan


def test_the_dataset_reads_through(helpers):
    dataset = ObjectDataset(MemoryConfig(helpers.numbered_objects(3)))
    loader = ConcurrentDataLoader(dataset)
    assert loader.dataset.keys is dataset.keys
    assert loader.dataset is dataset


def test_error_is_raised_with_its_type_and_object_after_earlier_batches(helpers):
    bad = helpers.key_for(23)
    store = MemoryConfig(helpers.numbered_objects(COUNT), script=denying({bad}))
    loader = ConcurrentDataLoader(
        ObjectDataset(store, decode=helpers.index_of), batch_size=5, collate_fn=list
    )
    got = []
    with pytest.raises(AccessDenied) as caught:
        for batch in loader:
            got.append(batch)
    assert got == sampler_batches(None, 5, False)[:4]
    assert caught.value.url == f"memory://test/{bad}"
    assert caught.value.cause is Reason.ACCESS_DENIED


def test_user_decode_error_names_the_object_and_is_skipped(helpers):
    def decode(data: bytes | bytearray) -> int:
        if helpers.index_of(data) == 7:
            raise ValueError("bad sample")
        return helpers.index_of(data)

    store = MemoryConfig(helpers.numbered_objects(COUNT))
    loader = ConcurrentDataLoader(
        ObjectDataset(store, decode=decode), batch_size=5, on_error="skip", max_skipped=1
    )
    assert sum(len(batch) for batch in loader) == COUNT - 1
    assert [s.url for s in loader.skipped] == [f"memory://test/{helpers.key_for(7)}"]
    assert isinstance(loader.skipped[0].error, DecodeError)
    assert isinstance(loader.skipped[0].error.__cause__, ValueError)


def test_skip_marks_batches_and_lists_what_was_left_out(helpers):
    bad = {helpers.key_for(i) for i in (2, 11, 12)}
    store = MemoryConfig(helpers.numbered_objects(COUNT), script=denying(bad))
    loader = ConcurrentDataLoader(
        ObjectDataset(store, decode=helpers.index_of),
        batch_size=5,
        collate_fn=list,
        on_error="skip",
        max_skipped=3,
    )
    got = list(loader)
    assert len(got) == 10
    assert got[0] == [0, 1, 3, 4] and isinstance(got[0], PartialList)
    assert [s.index for s in got[0].skipped] == [2]
    assert got[2] == [10, 13, 14] and [s.index for s in got[2].skipped] == [11, 12]
    assert [is_partial(b) for b in got] == [True, False, True] + [False] * 7
    assert [(s.index, s.url) for s in loader.skipped] == [
        (i, f"memory://test/{helpers.key_for(i)}") for i in (2, 11, 12)
    ]
    assert all(isinstance(s, SkippedSample) and s.error.url == s.url for s in loader.skipped)


def test_skipped_tensor_batches_carry_the_list(helpers):
    store = MemoryConfig(helpers.numbered_objects(10), script=denying({helpers.key_for(1)}))
    loader = ConcurrentDataLoader(
        ObjectDataset(store, decode=helpers.index_of),
        batch_size=5,
        on_error="skip",
        max_skipped=1,
    )
    first, second = list(loader)
    assert first.tolist() == [0, 2, 3, 4] and [s.index for s in first.skipped] == [1]
    assert not is_partial(second)


def test_a_batch_that_lost_every_sample_is_not_yielded(helpers):
    bad = {helpers.key_for(i) for i in range(5, 10)}
    store = MemoryConfig(helpers.numbered_objects(15), script=denying(bad))
    loader = ConcurrentDataLoader(
        ObjectDataset(store, decode=helpers.index_of),
        batch_size=5,
        collate_fn=list,
        on_error="skip",
        max_skipped=5,
    )
    assert list(loader) == [[0, 1, 2, 3, 4], [10, 11, 12, 13, 14]]
    assert len(loader.skipped) == 5


def test_skipping_past_the_budget_raises(helpers):
    bad = {helpers.key_for(i) for i in (1, 6, 11, 16)}
    store = MemoryConfig(helpers.numbered_objects(COUNT), script=denying(bad))
    loader = ConcurrentDataLoader(
        ObjectDataset(store, decode=helpers.index_of),
        batch_size=5,
        collate_fn=list,
        on_error="skip",
        max_skipped=2,
    )
    got = []
    with pytest.raises(SkipBudgetExceeded) as caught:
        for batch in loader:
            got.append(batch)
    assert [b.skipped[0].index for b in got] == [1, 6]  # within the budget
    error = caught.value
    assert error.cause is Reason.SKIP_BUDGET_EXCEEDED
    assert error.url == f"memory://test/{helpers.key_for(11)}"
    assert isinstance(error.__cause__, AccessDenied)
    assert "max_skipped=2" in str(error)


def test_a_fractional_budget_is_a_share_of_the_epochs_samples(helpers):
    bad = {helpers.key_for(i) for i in (1, 2, 3)}  # 3 of 50 = 6 %
    store = MemoryConfig(helpers.numbered_objects(COUNT), script=denying(bad))

    def run(max_skipped: float) -> list[Any]:
        loader = ConcurrentDataLoader(
            ObjectDataset(store, decode=helpers.index_of),
            batch_size=5,
            collate_fn=list,
            on_error="skip",
            max_skipped=max_skipped,
        )
        return list(loader)

    assert len(run(0.06)) == 10
    with pytest.raises(SkipBudgetExceeded):
        run(0.05)


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"max_skipped": 1.5}, ConfigError),
        ({"max_skipped": -1}, ConfigError),
        ({"on_error": "ignore"}, ConfigError),
        ({"prefetch_batches": 0}, ConfigError),
        ({"batch_sampler": [[0]], "batch_size": 2}, ValueError),
        ({"sampler": [0, 1], "shuffle": True}, ValueError),
    ],
)
def test_invalid_arguments_are_refused(helpers, kwargs, error):
    dataset = ObjectDataset(MemoryConfig(helpers.numbered_objects(3)))
    with pytest.raises(error):
        ConcurrentDataLoader(dataset, **kwargs)


def test_iterable_datasets_are_loaded_as_torch_loads_them():
    class Stream(IterableDataset[int]):
        def __iter__(self) -> Any:
            return iter(range(5))

    loader = ConcurrentDataLoader(Stream(), batch_size=2)
    assert [b.tolist() for b in loader] == [[0, 1], [2, 3], [4]]
    with pytest.raises(ConfigError, match="map-style"):
        loader.state_dict()


# ---------------------------------------------------------------------------- worker processes


@fork_warning
def test_two_workers_yield_the_samplers_batches_in_order(helpers):
    store = MemoryConfig(helpers.numbered_objects(COUNT), script=helpers.jitter(9, 0.003))
    loader = ConcurrentDataLoader(
        ObjectDataset(
            store, decode=helpers.index_of, fetch_config=FetchConfig(max_inflight_requests=8)
        ),
        batch_size=4,
        shuffle=True,
        generator=torch.Generator().manual_seed(5),
        collate_fn=list,
        num_workers=2,
        multiprocessing_context="fork",
    )
    assert list(loader) == sampler_batches(5, 4, False)
    stats = loader.stats()  # merged over both workers' rows
    assert stats["requests"] == COUNT
    assert stats["bytes"] == sum(len(b) for b in store.objects.values())


@fork_warning
def test_an_error_in_a_worker_arrives_with_its_type_and_object(helpers):
    bad = helpers.key_for(13)
    store = MemoryConfig(helpers.numbered_objects(20), script=denying({bad}))
    loader = ConcurrentDataLoader(
        ObjectDataset(store, decode=helpers.index_of),
        batch_size=4,
        collate_fn=list,
        num_workers=2,
        multiprocessing_context="fork",
    )
    got = []
    with pytest.raises(AccessDenied) as caught:
        for batch in loader:
            got.append(batch)
    assert got == sampler_batches(None, 4, False)[:3]
    assert caught.value.url == f"memory://test/{bad}"
    assert caught.value.cause is Reason.ACCESS_DENIED


@pytest.mark.parametrize("num_workers", [0, pytest.param(2, marks=fork_warning)])
def test_next_after_an_error_returns_the_following_batch(helpers, num_workers):
    bad = {helpers.key_for(i) for i in (5, 13)}  # batches 1 and 3 of 5
    store = MemoryConfig(helpers.numbered_objects(20), script=denying(bad))
    loader = ConcurrentDataLoader(
        ObjectDataset(store, decode=helpers.index_of),
        batch_size=4,
        collate_fn=list,
        num_workers=num_workers,
        multiprocessing_context="fork" if num_workers else None,
    )
    got: list[Any] = []
    iterator = iter(loader)
    while True:
        try:
            got.append(next(iterator))
        except StopIteration:
            break
        except AccessDenied as error:
            got.append(error.url)
    expected = sampler_batches(None, 4, False)[:5]
    assert got == [
        expected[0],
        f"memory://test/{helpers.key_for(5)}",
        expected[2],
        f"memory://test/{helpers.key_for(13)}",
        expected[4],
    ]
    state = loader.state_dict()  # the epoch ended: the next one
    assert (state["epoch"], state["batches_taken"]) == (1, 0)


def test_the_loader_is_generic_and_its_dataset_is_the_users(helpers):
    dataset = ObjectDataset(MemoryConfig(helpers.numbered_objects(3)))
    loader: ConcurrentDataLoader[Any] = ConcurrentDataLoader[Any](dataset, batch_size=2)
    assert loader.dataset is dataset and loader.batch_size == 2


class _Failing(Dataset[int]):
    def __len__(self) -> int:
        return 6

    def __getitem__(self, index: int) -> int:
        if index == 3:
            raise_for_three()
        return index


def raise_for_three() -> None:
    raise ValueError("three")


@pytest.mark.parametrize("num_workers", [0, pytest.param(2, marks=fork_warning)])
def test_an_error_from_user_code_notes_where_it_was_raised(num_workers):
    loader = ConcurrentDataLoader(
        _Failing(),
        batch_size=2,
        num_workers=num_workers,
        multiprocessing_context="fork" if num_workers else None,
    )
    with pytest.raises(ValueError, match="three") as caught:
        list(loader)
    notes = "\n".join(caught.value.__notes__)
    assert "while loading item 3 of _Failing" in notes
    assert "Original traceback in" in notes and "raise_for_three" in notes


class _WithItsOwnParts(Dataset[int]):
    parts = ["head", "tail"]  # the dataset's own attribute, not a PartsConfig

    def __len__(self) -> int:
        return 4

    def __getitem__(self, index: int) -> int:
        return index


def test_a_foreign_datasets_parts_attribute_is_left_to_it():
    loader = ConcurrentDataLoader(_WithItsOwnParts(), batch_size=2)
    assert [batch.tolist() for batch in loader] == [[0, 1], [2, 3]]
