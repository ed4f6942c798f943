"""The shard-order stream of one epoch, as pure functions of (lengths, seed, epoch, world).

Samples are numbered shard by shard (shard ``s`` holds ``offsets[s] .. offsets[s] +
lengths[s] - 1``). :func:`shard_permutation` orders the shards (the same on every rank);
:func:`assign_shards` gives each shard, whole, to exactly one rank, balanced by sample count;
:func:`rank_stream` lists a rank's indices, equalised to the same count on every rank.

:func:`shuffle_within_window` is a seeded shuffle buffer (WebDataset's) that also bounds how
far a sample travels: one read at stream position ``q`` is emitted by the time ``q + window``
is read. The buffer holds ``ceil(window / 2)`` samples; each emission is a uniform draw among
them unless one reaches the window's end (about 14 %); every element is emitted exactly once.
"""

from __future__ import annotations

import itertools
import random
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from typing import TypeVar

from ..errors import ConfigError

__all__ = [
    "assign_shards",
    "epoch_random",
    "interleave_batches",
    "rank_stream",
    "shard_permutation",
    "shuffle_within_window",
]

T = TypeVar("T")


def epoch_random(purpose: str, seed: int, epoch: int, rank: int = 0) -> random.Random:
    """A generator for one purpose of one epoch (and rank). Seeded from a string (hashed
    with SHA-512): the same sequence on every platform and Python version."""
    return random.Random(f"concurrent_loader.streaming:{purpose}:{seed}:{epoch}:{rank}")


def shard_permutation(num_shards: int, *, shuffle: bool, seed: int, epoch: int) -> list[int]:
    order = list(range(num_shards))
    if shuffle:
        epoch_random("shards", seed, epoch).shuffle(order)
    return order


def assign_shards(lengths: Sequence[int], order: Sequence[int], world_size: int) -> list[list[int]]:
    """Shards per rank: in ``order``, each shard goes to the rank with the fewest samples so
    far (the lowest on a tie), so the ranks' counts differ by at most the longest shard."""
    if world_size < 1:
        raise ConfigError(f"world_size must be >= 1, got {world_size}")
    nonempty = sum(1 for s in order if lengths[s] > 0)
    if nonempty < world_size:
        raise ConfigError(
            f"{nonempty} non-empty shards cannot be split by whole shards across {world_size} "
            "ranks: every rank needs at least one"
        )
    shards: list[list[int]] = [[] for _ in range(world_size)]
    loads = [0] * world_size
    for s in order:
        if lengths[s] == 0:
            continue
        rank = min(range(world_size), key=lambda r: (loads[r], r))
        shards[rank].append(s)
        loads[rank] += lengths[s]
    return shards


def rank_stream(
    lengths: Sequence[int], offsets: Sequence[int], shards: Sequence[int], count: int
) -> Iterator[int]:
    """The global indices of ``shards``, in order, cut or padded to ``count`` (padding starts
    again at the rank's first shard, not another rank's)."""

    def once() -> Iterator[int]:
        for s in shards:
            yield from range(offsets[s], offsets[s] + lengths[s])

    return itertools.islice(itertools.cycle(once()) if count else iter(()), count)


def interleave_batches(streams: Sequence[Iterator[int]], batch_size: int) -> Iterator[int]:
    """Batch ``k`` (``batch_size`` indices) from stream ``k % len(streams)``, so that worker
    ``w`` of a DataLoader gets one stream's indices. Every index comes once; a stream that
    runs out drops out of the turn (near the epoch's end the batches then mix streams)."""
    live = list(streams)
    turn = 0
    while live:
        turn %= len(live)
        batch = list(itertools.islice(live[turn], batch_size))
        yield from batch
        if len(batch) < batch_size:
            del live[turn]  # exhausted: the next stream takes this turn
        else:
            turn += 1


def shuffle_within_window(stream: Iterable[T], window: int, rng: random.Random) -> Iterator[T]:
    if window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    hold = -(-window // 2)
    # Slots: the buffered (position, item) pairs; emitted slots become None and are dropped
    # from the left of ``ages`` lazily, so finding the oldest buffered sample is O(1).
    slots: list[tuple[int, T]] = []
    ages: deque[int] = deque()  # positions in the buffer, oldest first (with stale ones)
    where: dict[int, int] = {}  # position -> index in slots
    position = 0

    def take(i: int) -> T:
        q, item = slots[i]
        last = slots.pop()
        if i < len(slots):
            slots[i] = last
            where[last[0]] = i
        del where[q]
        return item

    for item in stream:
        where[position] = len(slots)
        slots.append((position, item))
        ages.append(position)
        position += 1
        if len(slots) < hold:
            continue
        while ages[0] not in where:
            ages.popleft()
        if ages[0] <= position - 1 - window:
            # The oldest sample would leave the window with the next read: it goes now.
            yield take(where[ages.popleft()])
        else:
            yield take(rng.randrange(len(slots)))
    while slots:
        yield take(rng.randrange(len(slots)))
