"""Streaming reads of sharded datasets, as a sampler the loader already knows how to use:
:class:`ShardOrderSampler` (:mod:`.sampler`).
"""

from .sampler import ShardOrderSampler

__all__ = ["ShardOrderSampler"]
