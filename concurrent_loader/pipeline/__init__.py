"""Stage glue: one process's batches through fetch -> decode -> collate, in order."""

from .batches import BatchPipeline, source_of
from .options import PipelineOptions, available_cpus
from .slot import Partial, SkippedSample, Slot

__all__ = [
    "BatchPipeline",
    "Partial",
    "PipelineOptions",
    "SkippedSample",
    "Slot",
    "available_cpus",
    "source_of",
]
