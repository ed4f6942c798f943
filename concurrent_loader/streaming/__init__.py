"""Streaming reads of sharded datasets, as a sampler the loader already knows how to use.

:class:`ShardOrderSampler` orders a sharded dataset's indices shard by shard (shards
shuffled per epoch, samples through a seeded shuffle buffer, DDP ranks splitting whole
shards), so a :class:`~concurrent_loader.ConcurrentDataLoader` streams it with sequential
reads while keeping exact resume, the skip policy and in-order batches.
"""

from .sampler import ShardOrderSampler

__all__ = ["ShardOrderSampler"]
