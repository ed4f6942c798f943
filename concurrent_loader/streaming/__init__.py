"""Streaming reads of sharded datasets, as a sampler: :class:`ShardOrderSampler`."""

from .sampler import ShardOrderSampler

__all__ = ["ShardOrderSampler"]
