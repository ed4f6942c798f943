"""Sample sources: how a dataset index becomes reads from a store and then a sample."""

from .base import Read, SampleSource
from .objects import CallDecoder, ObjectDecoder, ObjectSource

__all__ = ["CallDecoder", "ObjectDecoder", "ObjectSource", "Read", "SampleSource"]
