"""Stage 2 of the pipeline: turning bytes into samples, on a thread pool.

:mod:`.encoded` is the other choice: ship the bytes and decode the batch in the main process.
"""

from .encoded import (
    DECODE_ON,
    BatchDecoder,
    DecodeOn,
    EncodedImage,
    EncodedImageDecoder,
    PILBatchDecoder,
    check_decode_on,
)
from .image import ImageDecoder, center_crop_box, to_tensor

__all__ = [
    "DECODE_ON",
    "BatchDecoder",
    "DecodeOn",
    "EncodedImage",
    "EncodedImageDecoder",
    "ImageDecoder",
    "PILBatchDecoder",
    "center_crop_box",
    "check_decode_on",
    "to_tensor",
]
