"""The loader users meet: :class:`ConcurrentDataLoader` and the marks of partial batches."""

from .dataloader import ConcurrentDataLoader
from .iterator import PartialBatch, PartialDict, PartialList, is_partial
from .ray_workers import RayExecutor

__all__ = ["ConcurrentDataLoader", "PartialBatch", "PartialDict", "PartialList", "RayExecutor"]
__all__ += ["is_partial"]
