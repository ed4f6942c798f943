"""Streaming as a sampler: shard order, a shuffle buffer, and DDP splitting by whole shards.

:class:`ShardOrderSampler` yields the global indices of a sharded dataset (samples numbered
shard by shard, in shard order, as ``ShardDataset`` numbers them) in the order a streaming
reader would produce them: shards shuffled per epoch, each rank reading its own whole
shards one after another, samples mixed by a seeded shuffle buffer. Because it is a
sampler, a :class:`~concurrent_loader.ConcurrentDataLoader` given it keeps everything it
promises: batch ``i`` is the sampler's batch ``i``, exact resume, the skip policy, every
start method. Reads of one batch fall in a few neighbouring shards, which the shard source
coalesces into large ranged GETs.

Guarantees, for given (``shard_lengths``, ``seed``, epoch, rank, world size):

- the order is a pure function of them (``set_epoch`` picks the epoch, as with
  ``DistributedSampler``), so a loader resumed from its ``state_dict()`` with the same
  epoch set redraws the same order and continues exactly;
- one rank (world size 1): every sample exactly once per epoch;
- several ranks: each shard is read by exactly one rank; every rank yields the same
  number of samples, ``len(sampler)``: with ``drop_last=False`` ranks with fewer samples
  repeat their own first samples up to the largest rank's count (every sample at least
  once), with ``drop_last=True`` ranks with more stop at the smallest rank's count (every
  sample at most once), as ``DistributedSampler`` pads or drops. Shards go to ranks in the
  epoch's shard order, each to the rank with the fewest samples so far, so the counts
  differ by at most one shard's length before equalising;
- locality: at any point the samples waiting in the buffer lie within ``buffer_size``
  consecutive samples of the rank's shard-order stream, so within
  ``ceil(buffer_size / shard_length) + 1`` shards (see :mod:`.buffer`);
- with ``workers=W`` and ``batch_size=B`` (the loader's ``num_workers`` and
  ``batch_size``), a rank's shards are split again, whole, between ``W`` streams, each
  with its own buffer, and batch ``k`` is taken from stream ``k % W``: the loader's worker
  ``k % W``, which makes batch ``k``, reads only the shards of its own stream, until the
  shortest stream runs out near the epoch's end (the streams' sample counts differ by at
  most the longest shard). Every sample still comes once (per rank, before equalising).
  With fewer non-empty shards than workers there is one stream.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence

from torch.utils.data import Sampler

from ..errors import ConfigError, Reason
from ..loader.state import world
from .buffer import shuffle_within_window
from .order import (
    assign_shards,
    epoch_random,
    interleave_batches,
    rank_stream,
    shard_permutation,
    target_count,
)

__all__ = ["ShardOrderSampler"]

DEFAULT_BUFFER_SIZE = 4096


class ShardOrderSampler(Sampler[int]):
    """Indices of a sharded dataset in streaming order (see the module for the guarantees).

    ``shard_lengths``: samples per shard, in shard order (``ShardDataset.shard_lengths``).
    ``shuffle``: shuffle the shards per epoch and the samples through the buffer; without
    it, shard order and tar order. ``buffer_size``: the shuffle window, in samples.
    ``rank`` / ``world_size``: None reads them from ``torch.distributed`` when iteration
    starts (or ``len()`` is taken), so the sampler may be made before
    ``init_process_group``. ``workers`` / ``batch_size``: give the loader's ``num_workers``
    and ``batch_size`` so that each worker reads whole shards of its own (see the module).
    """

    def __init__(
        self,
        shard_lengths: Sequence[int],
        *,
        shuffle: bool = True,
        buffer_size: int = DEFAULT_BUFFER_SIZE,
        seed: int = 0,
        drop_last: bool = False,
        rank: int | None = None,
        world_size: int | None = None,
        workers: int = 1,
        batch_size: int = 1,
    ) -> None:
        lengths = [int(n) for n in shard_lengths]
        if any(n < 0 for n in lengths):
            raise ConfigError(
                f"shard_lengths must be >= 0, got {min(lengths)}", cause=Reason.INVALID_ARGUMENT
            )
        if not any(lengths):
            raise ConfigError("no samples: every shard is empty", cause=Reason.INVALID_ARGUMENT)
        if isinstance(buffer_size, bool) or not isinstance(buffer_size, int) or buffer_size < 1:
            raise ConfigError(
                f"buffer_size must be an int >= 1, got {buffer_size!r}",
                cause=Reason.INVALID_ARGUMENT,
            )
        for name, value in (("workers", workers), ("batch_size", batch_size)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(
                    f"{name} must be an int >= 1, got {value!r}", cause=Reason.INVALID_ARGUMENT
                )
        if (rank is None) != (world_size is None):
            raise ConfigError(
                "give both rank and world_size, or neither", cause=Reason.INVALID_ARGUMENT
            )
        if world_size is not None and rank is not None and not 0 <= rank < world_size:
            raise ConfigError(
                f"rank must be in [0, {world_size}), got {rank}", cause=Reason.INVALID_ARGUMENT
            )
        self.shard_lengths = lengths
        self.offsets = [0, *itertools.accumulate(lengths)][:-1]
        self.shuffle = shuffle
        self.buffer_size = buffer_size
        self.seed = seed
        self.drop_last = drop_last
        self.rank = rank
        self.world_size = world_size
        self.workers = workers
        self.batch_size = batch_size
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        """Use epoch ``epoch``'s order from the next iteration on (the same on every rank)."""
        self.epoch = epoch

    def _world(self) -> tuple[int, int]:
        if self.rank is not None and self.world_size is not None:
            return self.rank, self.world_size
        rank, world_size = world()
        return rank, world_size

    def plan(self) -> tuple[list[int], int]:
        """This rank's shards this epoch, in reading order, and its sample count."""
        rank, world_size = self._world()
        order = shard_permutation(
            len(self.shard_lengths), shuffle=self.shuffle, seed=self.seed, epoch=self.epoch
        )
        per_rank = assign_shards(self.shard_lengths, order, world_size)
        loads = [sum(self.shard_lengths[s] for s in shards) for shards in per_rank]
        return per_rank[rank], target_count(loads, drop_last=self.drop_last)

    def __iter__(self) -> Iterator[int]:
        rank, _ = self._world()
        shards, count = self.plan()
        nonempty = [s for s in shards if self.shard_lengths[s] > 0]
        if self.workers == 1 or len(nonempty) < self.workers:
            return self._mixed(rank_stream(self.shard_lengths, self.offsets, shards, count), rank)
        # One stream per worker, each over whole shards of its own, batch k from stream
        # k % workers: the loader's worker k % workers reads only its own shards.
        per_worker = assign_shards(self.shard_lengths, nonempty, self.workers)
        streams = [
            self._mixed(
                rank_stream(
                    self.shard_lengths, self.offsets, own, sum(self.shard_lengths[s] for s in own)
                ),
                rank,
                worker,
            )
            for worker, own in enumerate(per_worker)
        ]
        once = interleave_batches(streams, self.batch_size)
        # Equal counts across ranks: pad by starting the rank's order again, or cut.
        return itertools.islice(itertools.cycle(once), count)

    def _mixed(self, stream: Iterator[int], rank: int, worker: int = 0) -> Iterator[int]:
        """``stream`` through this epoch's shuffle buffer (as it is without ``shuffle``)."""
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
