"""The GPU stage: batches copied to the device while the model computes, and stall metrics.

* :class:`CUDAPrefetcher` wraps any iterable of batches; a producer thread stages each
  batch in a small ring of pinned host buffers, copies it on a dedicated CUDA stream and
  converts the uint8 images to normalised float there, at most ``depth`` batches ahead.
  Without CUDA the same code runs on the CPU, still overlapping conversion with loading.
* :class:`StallMeter` and :func:`measure_stalls` split a training loop's step time into
  waiting for data and computing, and compare the loader-fed rate with a synthetic one.
* :class:`EncodedBatchDecoder` decodes the encoded images of a ``decode_on`` dataset, a
  batch in one call (nvJPEG on CUDA), for the prefetcher.
"""

from .decode import EncodedBatchDecoder, resize_crop
from .normalize import DEFAULT_IMAGE_KEYS, ImageTransform
from .prefetch import CUDAPrefetcher, PrefetchIterator
from .ring import PinnedRing
from .stall import StallComparison, StallMeter, StallReport, measure_stalls, repeat_batch

__all__ = [
    "DEFAULT_IMAGE_KEYS",
    "CUDAPrefetcher",
    "EncodedBatchDecoder",
    "ImageTransform",
    "PinnedRing",
    "PrefetchIterator",
    "StallComparison",
    "StallMeter",
    "StallReport",
    "measure_stalls",
    "repeat_batch",
    "resize_crop",
]
