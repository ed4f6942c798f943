"""The loader users meet: :class:`ConcurrentDataLoader` (:mod:`.dataloader`), with its epoch
plan (:mod:`.plan`), per-worker iteration (:mod:`.worker`), resumable state (:mod:`.state`)
and skip marking (:mod:`.partial`)."""

from .dataloader import ConcurrentDataLoader
from .partial import PartialBatch, PartialDict, PartialList, is_partial

__all__ = ["ConcurrentDataLoader", "PartialBatch", "PartialDict", "PartialList", "is_partial"]
