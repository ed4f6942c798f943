"""ShardOrderSampler: coverage, determinism, locality, DDP splitting and ``len`` (pure logic)."""

from __future__ import annotations

import itertools
import math
import random
from collections import Counter

import pytest

from concurrent_loader.errors import ConfigError
from concurrent_loader.streaming import ShardOrderSampler
from concurrent_loader.streaming.sampler import (
    interleave_batches,
    shuffle_within_window,
    stream_sizes,
)

EQUAL = [25] * 12
UNEQUAL = [31, 7, 40, 12, 25, 1, 33, 18, 9, 27, 14, 22, 5]


def shard_of(lengths: list[int]) -> list[int]:
    """Global index -> shard, for samples numbered shard by shard."""
    return [s for s, n in enumerate(lengths) for _ in range(n)]


def ranks(
    lengths: list[int], world_size: int, workers: int = 1, batch_size: int = 1, **kwargs: object
) -> list[list[int]]:
    samplers = [
        ShardOrderSampler(lengths, rank=r, world_size=world_size, **kwargs)  # type: ignore[arg-type]
        for r in range(world_size)
    ]
    for sampler in samplers:
        sampler.set_batching(batch_size=batch_size, num_workers=workers)
    return [list(sampler) for sampler in samplers]


@pytest.mark.parametrize("lengths", [EQUAL, UNEQUAL, [1], [0, 5, 0, 3]])
@pytest.mark.parametrize("buffer_size", [1, 7, 64, 10_000])
@pytest.mark.parametrize("epoch", [0, 3])
def test_one_rank_yields_every_sample_exactly_once(lengths, buffer_size, epoch):
    sampler = ShardOrderSampler(lengths, buffer_size=buffer_size, seed=5)
    sampler.set_epoch(epoch)
    got = list(sampler)
    assert sorted(got) == list(range(sum(lengths)))
    assert len(sampler) == len(got)


def test_without_shuffle_the_order_is_shard_order():
    assert list(ShardOrderSampler(UNEQUAL, shuffle=False)) == list(range(sum(UNEQUAL)))


def test_the_order_is_a_function_of_seed_epoch_rank_and_world():
    def draw(seed: int, epoch: int, rank: int = 0, world: int = 1) -> list[int]:
        sampler = ShardOrderSampler(UNEQUAL, buffer_size=32, seed=seed, rank=rank, world_size=world)
        sampler.set_epoch(epoch)
        return list(sampler)

    assert draw(1, 2) == draw(1, 2)
    assert draw(1, 2, 1, 3) == draw(1, 2, 1, 3)
    assert draw(1, 2) != draw(1, 3)
    assert draw(1, 2) != draw(2, 2)
    assert draw(1, 2, 0, 3) != draw(1, 2, 1, 3)


def test_shards_are_shuffled_per_epoch_and_samples_mixed():
    sampler = ShardOrderSampler(EQUAL, buffer_size=50)
    firsts = set()
    for epoch in range(6):
        sampler.set_epoch(epoch)
        order = list(sampler)
        firsts.add(shard_of(EQUAL)[order[0]])
        # Mixed: far from the sorted order within each shard.
        assert sum(1 for a, b in itertools.pairwise(order) if b == a + 1) < len(order) / 3
    assert len(firsts) > 1


@pytest.mark.parametrize(("lengths", "buffer_size"), [(EQUAL, 10), (EQUAL, 60), ([100] * 8, 100)])
def test_samples_in_the_buffer_span_a_bounded_number_of_shards(lengths, buffer_size):
    """Replays the buffer: at each emission, the samples still waiting (plus the one emitted)
    lie in at most ceil(buffer / shard) + 1 shards."""
    shard = shard_of(lengths)
    bound = math.ceil(buffer_size / lengths[0]) + 1
    for epoch in range(4):
        sampler = ShardOrderSampler(lengths, buffer_size=buffer_size, seed=epoch)
        sampler.set_epoch(epoch)
        shards, _ = sampler.plan()
        stream = [i for s in shards for i in range(sum(lengths[:s]), sum(lengths[: s + 1]))]
        emitted = list(sampler)
        read = 0
        waiting: set[int] = set()
        position = {index: p for p, index in enumerate(stream)}
        hold = -(-buffer_size // 2)
        worst = 0
        for index in emitted:
            # An emission happens once the sample is read and the buffer holds ``hold``.
            while read < len(stream) and (index not in waiting or len(waiting) < hold):
                waiting.add(stream[read])
                read += 1
            worst = max(worst, len({shard[i] for i in waiting}))
            assert read - 1 - position[index] <= buffer_size
            waiting.remove(index)
        assert worst <= bound


def test_the_buffer_never_lets_a_sample_travel_past_its_window():
    rng = random.Random(0)
    out = list(shuffle_within_window(range(10_000), 40, rng))
    assert sorted(out) == list(range(10_000))
    # Sample q is emitted by the time position q + 40 has been read: at most ~40 later.
    assert max(abs(p - q) for p, q in enumerate(out)) <= 40


@pytest.mark.parametrize("lengths", [EQUAL, UNEQUAL])
@pytest.mark.parametrize("world_size", [2, 3, 5])
@pytest.mark.parametrize("drop_last", [False, True])
def test_ranks_read_disjoint_whole_shards_with_equal_counts(lengths, world_size, drop_last):
    shard = shard_of(lengths)
    for epoch in range(3):
        per_rank = []
        for r in range(world_size):
            sampler = ShardOrderSampler(
                lengths, rank=r, world_size=world_size, drop_last=drop_last, buffer_size=16
            )
            sampler.set_epoch(epoch)
            per_rank.append((list(sampler), len(sampler), sampler.plan()[0]))
        counts = {len(got) for got, _, _ in per_rank}
        assert len(counts) == 1, counts
        assert all(n == len(got) for got, n, _ in per_rank)
        shard_sets = [set(shards) for _, _, shards in per_rank]
        # Whole shards: a shard's samples appear on one rank only.
        for a in range(world_size):
            assert {shard[i] for i in per_rank[a][0]} <= shard_sets[a]
            for b in range(a + 1, world_size):
                assert not shard_sets[a] & shard_sets[b]
        everything = Counter(i for got, _, _ in per_rank for i in got)
        total = sum(lengths)
        if drop_last:
            assert max(everything.values()) == 1  # at most once
            assert len(everything) == counts.pop() * world_size
        else:
            assert set(everything) == set(range(total))  # at least once
            assert sum(everything.values()) == counts.pop() * world_size
        # Balanced before equalising: within the longest shard.
        loads = [sum(lengths[s] for s in shards) for shards in shard_sets]
        assert max(loads) - min(loads) <= max(lengths)


def test_rank_and_world_size_are_read_when_iteration_starts(monkeypatch):
    import concurrent_loader.streaming.sampler as module

    sampler = ShardOrderSampler(EQUAL, buffer_size=8)
    assert len(sampler) == sum(EQUAL)
    monkeypatch.setattr(module, "world", lambda: (1, 3))
    expected = ShardOrderSampler(EQUAL, buffer_size=8, rank=1, world_size=3)
    assert len(sampler) == len(expected) == 100
    assert list(sampler) == list(expected)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"shard_lengths": []},
        {"shard_lengths": [0, 0]},
        {"shard_lengths": [3, -1]},
        {"shard_lengths": [3], "buffer_size": 0},
        {"shard_lengths": [3], "buffer_size": 2.5},
        {"shard_lengths": [3], "rank": 0},
        {"shard_lengths": [3], "rank": 2, "world_size": 2},
    ],
)
def test_bad_arguments_are_config_errors(kwargs):
    lengths = kwargs.pop("shard_lengths")
    with pytest.raises(ConfigError):
        ShardOrderSampler(lengths, **kwargs)


@pytest.mark.parametrize(("batch_size", "num_workers"), [(1, 0), (True, 1), (2, 1.5)])
def test_bad_batching_is_a_config_error(batch_size, num_workers):
    with pytest.raises(ConfigError):
        ShardOrderSampler([3]).set_batching(batch_size=batch_size, num_workers=num_workers)


def test_the_loader_hands_the_sampler_its_workers_and_batch_size():
    from concurrent_loader import ConcurrentDataLoader

    sampler = ShardOrderSampler(EQUAL)
    dataset = list(range(sum(EQUAL)))
    loader = ConcurrentDataLoader(dataset, batch_size=4, sampler=sampler, collate_fn=list)  # type: ignore[arg-type]
    next(iter(loader))
    assert (sampler.batch_size, sampler.workers) == (4, 1)
    loader = ConcurrentDataLoader(
        dataset,  # type: ignore[arg-type]
        batch_size=3,
        sampler=sampler,
        num_workers=2,
        collate_fn=list,
        multiprocessing_context="fork",
    )
    assert sorted(i for batch in loader for i in batch) == dataset
    assert (sampler.batch_size, sampler.workers) == (3, 2)


def test_more_ranks_than_shards_is_a_config_error():
    sampler = ShardOrderSampler([5, 5], rank=0, world_size=3)
    with pytest.raises(ConfigError, match="2 non-empty shards cannot be split"):
        list(sampler)


@pytest.mark.parametrize("lengths", [EQUAL, UNEQUAL, [1000, 3, 997]])
@pytest.mark.parametrize(("workers", "batch_size"), [(2, 8), (3, 5), (4, 16), (8, 3)])
@pytest.mark.parametrize("shuffle", [True, False])
def test_with_workers_each_worker_reads_its_own_run_of_shards_all_epoch(
    lengths, workers, batch_size, shuffle
):
    shard = shard_of(lengths)
    for epoch in range(2):
        sampler = ShardOrderSampler(lengths, shuffle=shuffle, buffer_size=16)
        sampler.set_batching(batch_size=batch_size, num_workers=workers)
        sampler.set_epoch(epoch)
        got = list(sampler)
        assert sorted(got) == list(range(sum(lengths)))  # every sample once
        assert len(sampler) == len(got)
        batches = [got[k : k + batch_size] for k in range(0, len(got), batch_size)]
        assert all(len(batch) == batch_size for batch in batches[:-1])
        # Which workers read each shard: one, more only where cuts split it, each cut adding
        # one reader (an uneven end of an epoch used to let every worker read the others'
        # last shards).
        readers: dict[int, set[int]] = {}
        for k, batch in enumerate(batches):
            for i in batch:
                readers.setdefault(shard[i], set()).add(k % workers)
        assert sum(len(r) - 1 for r in readers.values()) <= workers - 1
        runs = [sorted(s for s, r in readers.items() if w in r) for w in range(workers)]
        assert all(len(run) > 0 for run in runs)


@pytest.mark.parametrize("total", [0, 1, 7, 64, 65, 1000])
@pytest.mark.parametrize(("batch_size", "workers"), [(1, 1), (8, 3), (64, 8)])
def test_stream_sizes_give_batch_k_to_stream_k_mod_w(total, batch_size, workers):
    sizes = stream_sizes(total, batch_size, workers)
    assert sum(sizes) == total
    streams = [iter(range(n)) for n in sizes]
    order = list(interleave_batches(streams, batch_size))
    batches = [order[k : k + batch_size] for k in range(0, total, batch_size)]
    assert [sizes[w] for w in range(workers)] == [
        sum(len(b) for k, b in enumerate(batches) if k % workers == w) for w in range(workers)
    ]


def test_workers_beyond_the_shards_each_read_a_run_of_one():
    sampler = ShardOrderSampler([5, 5])
    sampler.set_batching(batch_size=2, num_workers=4)
    assert sorted(sampler) == list(range(10))


@pytest.mark.parametrize("drop_last", [False, True])
def test_workers_within_ranks_keep_the_ranks_whole_shards_and_equal_counts(drop_last):
    shard = shard_of(UNEQUAL)
    per_rank = ranks(UNEQUAL, 2, workers=2, batch_size=4, drop_last=drop_last, buffer_size=8)
    assert len({len(got) for got in per_rank}) == 1
    mine = [{shard[i] for i in got} for got in per_rank]
    assert not mine[0] & mine[1]
    everything = Counter(i for got in per_rank for i in got)
    if drop_last:
        assert max(everything.values()) == 1
    else:
        assert set(everything) == set(range(sum(UNEQUAL)))
