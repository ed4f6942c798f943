"""EpochPlan: the epoch's batches in shared memory; worker ``w`` of ``W`` gets ``w::W``, or
workers claim batches, each exactly once; any index objects, not only ints."""

from __future__ import annotations

import random
import threading

import pytest

from concurrent_loader.errors import ConfigError, Reason
from concurrent_loader.loader.plan import EpochPlan


def random_batches(seed: int, count: int, batch_size: int) -> list[list[int]]:
    order = list(range(count))
    random.Random(seed).shuffle(order)
    return [order[i : i + batch_size] for i in range(0, count, batch_size)]


@pytest.mark.parametrize("num_workers", [1, 2, 3, 4, 7])
def test_each_worker_gets_every_num_workers_th_batch(num_workers):
    batches = random_batches(1, 53, 5)  # 11 batches, the last one short
    plan = EpochPlan()
    plan.write(batches, may_grow=True)
    shares = [plan.batches()[w::num_workers] for w in range(num_workers)]
    for w, share in enumerate(shares):
        assert share == batches[w::num_workers]
    # torch's round robin over the workers gives back the plan's order
    interleaved = [shares[b % num_workers][b // num_workers] for b in range(len(batches))]
    assert interleaved == batches


def test_more_workers_than_batches_leaves_some_idle():
    plan = EpochPlan()
    plan.write([[0, 1], [2]], may_grow=True)
    assert [plan.batches()[w::4] for w in range(4)] == [[[0, 1]], [[2]], [], []]


def test_empty_plan():
    plan = EpochPlan()
    plan.write([], may_grow=True)
    assert plan.batches() == []


def test_a_later_smaller_epoch_replaces_the_plan_in_place():
    plan = EpochPlan()
    plan.write(random_batches(2, 40, 4), may_grow=True)
    blob = plan.blob
    smaller = random_batches(3, 10, 3)
    plan.write(smaller, may_grow=False)
    assert plan.blob is blob  # the same shared buffer: persistent workers see it
    assert plan.batches() == smaller


def test_a_larger_epoch_grows_the_plan_unless_workers_are_persistent():
    plan = EpochPlan()
    plan.write(random_batches(4, 10, 2), may_grow=True)
    larger = random_batches(5, 3000, 2)  # beyond the slack left for another order
    with pytest.raises(ConfigError, match="persistent_workers") as caught:
        plan.write(larger, may_grow=False)
    assert caught.value.cause is Reason.INVALID_ARGUMENT
    plan.write(larger, may_grow=True)
    assert plan.batches() == larger


def test_room_sizes_the_buffers_for_the_whole_epoch():
    """A resumed epoch writes only its rest, but later epochs need room for all of it."""
    plan = EpochPlan()
    whole = random_batches(6, 40, 4)
    plan.write(whole[7:], may_grow=True, room=whole)
    assert plan.batches() == whole[7:]
    plan.write(whole, may_grow=False)  # the next epoch, with persistent workers
    assert plan.batches()[1::2] == whole[1::2]


def test_buffers_are_in_shared_memory():
    plan = EpochPlan()
    plan.write([[1, 2, 3]], may_grow=True)
    assert plan.blob.is_shared() and plan.control.is_shared()


def test_indices_of_any_kind_are_kept_as_they_are():
    batches = [["a", ("b", 1)], [[0, 1, 2]], [True, 3.5, None]]
    plan = EpochPlan()
    plan.write(batches, may_grow=True)
    assert plan.batches() == batches
    assert plan.batches()[1::2] == batches[1::2]
    plan.write([[1, 2]], may_grow=False)  # ints, in the same buffer
    assert plan.batches() == [[1, 2]]


def test_a_persistent_plan_of_other_indices_has_room_for_another_order():
    keys = [f"key-{i}" for i in range(100)]
    plan = EpochPlan()
    plan.write([keys[i : i + 10] for i in range(0, 100, 10)], may_grow=True)
    random.Random(1).shuffle(keys)
    later = [keys[i : i + 7] for i in range(0, 100, 7)]
    plan.write(later, may_grow=False)
    assert plan.batches() == later


def test_each_batch_is_claimed_once_and_only_in_its_generation():
    lock = threading.Lock()
    plan = EpochPlan()
    plan.write(random_batches(7, 20, 3), may_grow=True)
    generation = plan.generation
    claimed: list[int] = []

    def claim_all() -> None:
        while (b := plan.claim(lock, generation)) is not None:
            claimed.append(b)

    threads = [threading.Thread(target=claim_all) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(claimed) == list(range(7))
    plan.write(random_batches(8, 20, 3), may_grow=False, lock=lock)
    assert plan.claim(lock, generation) is None  # a claim of the last epoch gets nothing
    assert plan.claim(lock, plan.generation) == 0
