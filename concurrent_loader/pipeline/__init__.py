"""Stage glue: one process's batches through fetch -> decode -> collate, in order."""

from .batches import BatchPipeline, source_of
from .options import PipelineOptions, available_cpus, worker_count
from .slot import Failure, Partial, SkippedSample

__all__ = ["BatchPipeline", "Failure", "Partial", "PipelineOptions", "SkippedSample"]
__all__ += ["available_cpus", "source_of", "worker_count"]
