"""Streaming as a sampler: :class:`ShardOrderSampler` yields a sharded dataset's global
indices (as ``ShardDataset`` numbers them) in streaming order: shards shuffled per epoch,
each rank reading its own whole shards, samples mixed by a seeded shuffle buffer. As a plain
sampler it keeps every promise of the loader (order, exact resume, the skip policy, every
start method).

Guarantees, for given (``shard_lengths``, ``seed``, epoch, rank, world size):

- the order is a pure function of them (``set_epoch`` picks the epoch);
- one rank: every sample exactly once per epoch;
- several ranks: each shard goes to exactly one rank; every rank yields ``len(sampler)``
  samples, padding with its own first samples (``drop_last=False``) or stopping at the
  smallest rank's count (``drop_last=True``), as ``DistributedSampler`` does;
- locality: the buffered samples lie within ``buffer_size`` consecutive samples of the
  rank's stream;
- given the loader's ``W`` workers (:meth:`ShardOrderSampler.set_batching`), a rank's samples,
  in its shard order, are cut into ``W`` consecutive streams sized so that batch ``k`` comes
  from stream ``k % W`` (the batch worker ``k % W`` makes) for the whole epoch: a worker reads
  its own run of shards, and only a shard at a cut is read in part by two neighbouring
  streams (with padding, the padded samples come from the rank's first batches).

Samples are numbered shard by shard (shard ``s`` holds ``offsets[s] .. offsets[s] +
lengths[s] - 1``); the functions below the sampler compute the stream.
"""

from __future__ import annotations

import itertools
import random
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from typing import TypeVar

import torch.distributed as dist
from torch.utils.data import Sampler

from ..config import check_count
from ..errors import ConfigError

__all__ = ["ShardOrderSampler"]

T = TypeVar("T")


def world() -> tuple[int, int]:
    """(rank, world size) under torch.distributed, else (0, 1); read when called."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


class ShardOrderSampler(Sampler[int]):
    """Indices of a sharded dataset in streaming order (see the module for the guarantees).

    ``shard_lengths``: samples per shard (``ShardDataset.shard_lengths``). ``shuffle``: the
    shards per epoch and the samples through the buffer; without it, shard and tar order.
    ``buffer_size``: the shuffle window, in samples. ``rank`` / ``world_size``: None reads
    them from ``torch.distributed`` when iteration starts (or ``len()`` is taken).
    """

    def __init__(
        self,
        shard_lengths: Sequence[int],
        *,
        shuffle: bool = True,
        buffer_size: int = 4096,
        seed: int = 0,
        drop_last: bool = False,
        rank: int | None = None,
        world_size: int | None = None,
    ) -> None:
        lengths = [int(n) for n in shard_lengths]
        if any(n < 0 for n in lengths):
            raise ConfigError(f"shard_lengths must be >= 0, got {min(lengths)}")
        if not any(lengths):
            raise ConfigError("no samples: every shard is empty")
        check_count("buffer_size", buffer_size)
        if (rank is None) != (world_size is None):
            raise ConfigError("give both rank and world_size, or neither")
        if world_size is not None and rank is not None and not 0 <= rank < world_size:
            raise ConfigError(f"rank must be in [0, {world_size}), got {rank}")
        self.shard_lengths = lengths
        self.offsets = [0, *itertools.accumulate(lengths)][:-1]
        self.shuffle = shuffle
        self.buffer_size = buffer_size
        self.seed = seed
        self.drop_last = drop_last
        self.rank = rank
        self.world_size = world_size
        self.workers = 1
        self.batch_size = 1
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        """Use epoch ``epoch``'s order from the next iteration on (the same on every rank)."""
        self.epoch = epoch

    def set_batching(self, *, batch_size: int, num_workers: int) -> None:
        """Batch ``k`` of ``batch_size`` samples is made by worker ``k % num_workers``.
        ``ConcurrentDataLoader`` calls it as each epoch starts; another loader's user may
        call it before iterating."""
        check_count("batch_size", batch_size)
        check_count("num_workers", num_workers)
        self.batch_size = batch_size
        self.workers = num_workers

    def _world(self) -> tuple[int, int]:
        if self.rank is not None and self.world_size is not None:
            return self.rank, self.world_size
        return world()

    def plan(self) -> tuple[list[int], int]:
        """This rank's shards this epoch, in reading order, and its sample count."""
        rank, world_size = self._world()
        order = shard_permutation(
            len(self.shard_lengths), shuffle=self.shuffle, seed=self.seed, epoch=self.epoch
        )
        per_rank = assign_shards(self.shard_lengths, order, world_size)
        loads = [sum(self.shard_lengths[s] for s in shards) for shards in per_rank]
        # As DistributedSampler: the others padded to the most, or cut to the fewest.
        return per_rank[rank], min(loads) if self.drop_last else max(loads)

    def __iter__(self) -> Iterator[int]:
        rank, _ = self._world()
        shards, count = self.plan()
        nonempty = [s for s in shards if self.shard_lengths[s] > 0]
        # Equal counts across ranks: pad by starting the rank's order again, or cut.
        if self.workers == 1:
            padded = itertools.islice(itertools.cycle(self._indices(shards)), count)
            return self._mixed(padded, rank)
        # One stream per worker, consecutive runs of the rank's samples sized so that batch
        # k comes from stream k % workers: the loader's worker k % workers reads its own run.
        total = sum(self.shard_lengths[s] for s in nonempty)
        sizes = stream_sizes(total, self.batch_size, self.workers)
        starts = [0, *itertools.accumulate(sizes)]
        streams = [
            self._mixed(self._indices(nonempty, starts[w], starts[w + 1]), rank, w)
            for w in range(self.workers)
        ]
        once = interleave_batches(streams, self.batch_size)
        return itertools.islice(itertools.cycle(once), count)

    def _indices(
        self, shards: Sequence[int], start: int = 0, stop: int | None = None
    ) -> Iterator[int]:
        """Positions ``start`` to ``stop`` of the samples of ``shards``, shard by shard."""
        position = 0
        for s in shards:
            length = self.shard_lengths[s]
            low, high = (
                max(start - position, 0),
                length if stop is None else min(stop - position, length),
            )
            if low < high:
                yield from range(self.offsets[s] + low, self.offsets[s] + high)
            position += length
            if stop is not None and position >= stop:
                return

    def _mixed(self, stream: Iterator[int], rank: int, worker: int = 0) -> Iterator[int]:
        if not self.shuffle:
            return stream
        purpose = "buffer" if worker == 0 else f"buffer-worker-{worker}"
        rng = epoch_random(purpose, self.seed, self.epoch, rank)
        return shuffle_within_window(stream, self.buffer_size, rng)

    def __len__(self) -> int:
        return self.plan()[1]

    def __repr__(self) -> str:
        return (
            f"ShardOrderSampler({len(self.shard_lengths)} shards, "
            f"{sum(self.shard_lengths)} samples, shuffle={self.shuffle}, "
            f"buffer_size={self.buffer_size}, seed={self.seed}, epoch={self.epoch})"
        )


def epoch_random(purpose: str, seed: int, epoch: int, rank: int = 0) -> random.Random:
    """A generator for one purpose of one epoch (and rank). Seeded from a string (hashed
    with SHA-512): the same sequence on every platform and Python version."""
    return random.Random(f"concurrent_loader.streaming:{purpose}:{seed}:{epoch}:{rank}")


def shard_permutation(num_shards: int, *, shuffle: bool, seed: int, epoch: int) -> list[int]:
    """The epoch's order of the shards, the same on every rank."""
    order = list(range(num_shards))
    if shuffle:
        epoch_random("shards", seed, epoch).shuffle(order)
    return order


def assign_shards(lengths: Sequence[int], order: Sequence[int], world_size: int) -> list[list[int]]:
    """Shards per rank: in ``order``, each shard goes to the rank with the fewest samples so
    far (the lowest on a tie), so the ranks' counts differ by at most the longest shard."""
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


def stream_sizes(total: int, batch_size: int, workers: int) -> list[int]:
    """Samples in each of ``workers`` streams of ``total`` such that batch ``k`` (of
    ``batch_size``, the last one short) is the ``k // workers``-th of stream ``k % workers``."""
    full, rest = divmod(total, batch_size)
    sizes = [batch_size * (full // workers + (w < full % workers)) for w in range(workers)]
    sizes[full % workers] += rest
    return sizes


def interleave_batches(streams: Sequence[Iterator[int]], batch_size: int) -> Iterator[int]:
    """Batch ``k`` (``batch_size`` indices) from stream ``k % len(streams)``, so that worker
    ``w`` of a DataLoader gets one stream's indices (streams of ``stream_sizes``: for the whole
    epoch). Every index comes once; a stream that runs out drops out of the turn."""
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
    """A seeded shuffle buffer (WebDataset's) that also bounds how far a sample travels: one
    read at stream position ``q`` is emitted by the time ``q + window`` is read. The buffer
    holds ``ceil(window / 2)`` samples; each emission is a uniform draw among them unless one
    reaches the window's end (about 14 %); every element is emitted exactly once."""
    hold = -(-window // 2)
    # Emitted positions leave ``ages`` lazily, from the left: the oldest is found in O(1).
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
