"""Turning bytes into samples on the pipeline's thread pool (:mod:`.image`), or shipping the
bytes to decode the batch in the main process (:mod:`.encoded`); images stored once at a
smaller size (:mod:`.presize`), which both read.
"""

from .encoded import (
    DECODE_ON,
    BatchDecoder,
    DecodeOn,
    EncodedImage,
    EncodedImageDecoder,
    PILBatchDecoder,
    check_decode_on,
    image_decoder,
)
from .image import ImageDecoder, center_crop_box, to_tensor
from .presize import Presize, is_raw, read_raw

__all__ = [
    "DECODE_ON",
    "BatchDecoder",
    "DecodeOn",
    "EncodedImage",
    "EncodedImageDecoder",
    "ImageDecoder",
    "PILBatchDecoder",
    "Presize",
    "center_crop_box",
    "check_decode_on",
    "image_decoder",
    "is_raw",
    "read_raw",
    "to_tensor",
]
