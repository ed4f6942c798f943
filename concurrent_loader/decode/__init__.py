"""Turning bytes into samples on the pipeline's thread pool (:mod:`.image`), or shipping the
bytes to decode the batch in the main process (:mod:`.encoded`).
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
