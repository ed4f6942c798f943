"""The loader users meet: :class:`ConcurrentDataLoader` and the marks of partial batches."""

from .dataloader import ConcurrentDataLoader
from .iterator import PartialBatch, PartialDict, PartialList, is_partial

__all__ = ["ConcurrentDataLoader", "PartialBatch", "PartialDict", "PartialList", "is_partial"]
