"""Stage 2 of the pipeline: turning bytes into samples, on a thread pool."""

from .image import ImageDecoder, center_crop_box, to_tensor

__all__ = ["ImageDecoder", "center_crop_box", "to_tensor"]
