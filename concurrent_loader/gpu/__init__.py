"""The GPU stage: batches copied to the device while the model computes, and stall metrics.

:class:`CUDAPrefetcher` (:mod:`.prefetch`) stages, copies and normalises batches ahead of the
loop (on the host without CUDA); :class:`EncodedBatchDecoder` (:mod:`.decode`) decodes a
``decode_on`` dataset's batches for it; :class:`StallMeter` and :func:`measure_stalls`
(:mod:`.stall`) measure how long the loop waits for data.
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
