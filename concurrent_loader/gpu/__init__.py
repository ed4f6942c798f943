"""The GPU stage: batches copied (and decoded, normalised) on the device while the model
computes (:class:`CUDAPrefetcher`), and how long the loop waits for data (:mod:`.stall`)."""

from .decode import EncodedBatchDecoder, resize_crop
from .normalize import DEFAULT_IMAGE_KEYS, ImageTransform
from .prefetch import CUDAPrefetcher, PrefetchIterator
from .stall import StallComparison, StallMeter, StallReport, measure_stalls, repeat_batch
from .transfer import PinnedRing

__all__ = ["DEFAULT_IMAGE_KEYS", "CUDAPrefetcher", "EncodedBatchDecoder", "ImageTransform"]
__all__ += ["PinnedRing", "PrefetchIterator", "StallComparison", "StallMeter", "StallReport"]
__all__ += ["measure_stalls", "repeat_batch", "resize_crop"]
