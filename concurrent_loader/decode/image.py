"""Image decoding: bytes in, a uint8 CHW tensor (or a user transform's output) out.

The fused path (``image_size`` given) decodes a JPEG at a reduced DCT scale when the target
is smaller, then resizes and centre-crops in one ``Image.resize(box=...)``, matching
torchvision's ``Resize(s) + CenterCrop(s)``. Pillow releases the GIL, so threads scale.

The raw form of :mod:`.presize` (uint8 pixels with their shape) is read without a decode:
the fused path crops and resizes from the array with the same geometry as for a JPEG
(:func:`center_crop_box`), a ``transform`` gets a PIL image made from the array, and with
neither the array itself becomes the tensor.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from PIL import Image, JpegImagePlugin

from ..errors import DecodeError, Reason
from .presize import is_raw, read_raw

__all__ = ["ImageDecoder", "center_crop_box", "to_tensor"]


def center_crop_box(
    width: int, height: int, out_h: int, out_w: int
) -> tuple[float, float, float, float]:
    """The source box that, resized to ``(out_w, out_h)``, equals resize-shorter-side then
    centre-crop: the largest centred box with the output's aspect ratio."""
    scale = max(out_w / width, out_h / height)
    box_w, box_h = out_w / scale, out_h / scale
    # Clamp: float rounding may put an edge a hair outside the image, which Pillow refuses.
    left, top = max(0.0, (width - box_w) / 2), max(0.0, (height - box_h) / 2)
    return (left, top, min(float(width), left + box_w), min(float(height), top + box_h))


def to_tensor(image: Image.Image) -> torch.Tensor:
    """Contiguous uint8 CHW tensor of an RGB or L image.

    The HWC -> CHW transpose is done here, per image on a decode thread, in one copy:
    stacking permuted views into a batch instead costs a strided copy per batch on the
    consumer's thread (measured: about 10x slower than stacking contiguous images).
    """
    array = np.asarray(image)
    if array.ndim == 2:
        array = array[:, :, None]
    # A copy always: for one channel the transpose is already contiguous, and PIL's array
    # is read-only.
    return torch.from_numpy(array.transpose(2, 0, 1).copy())


class ImageDecoder:
    """Callable decoding image bytes.

    - ``image_size`` None and no ``transform``: the full image as a uint8 CHW tensor;
    - ``image_size`` (int or (h, w)): fused draft-decode, resize and centre-crop to that size;
    - ``transform``: called on the (possibly already resized) PIL image; its output is the item.
    """

    def __init__(
        self,
        image_size: int | tuple[int, int] | None = None,
        *,
        transform: Callable[[Image.Image], Any] | None = None,
        mode: str = "RGB",
        draft: bool = True,
        resample: int = Image.Resampling.BILINEAR,
    ) -> None:
        if isinstance(image_size, int):
            image_size = (image_size, image_size)
        if image_size is not None and (len(image_size) != 2 or min(image_size) < 1):
            raise ValueError(f"image_size must be a positive int or (h, w), got {image_size!r}")
        self.image_size = image_size
        self.transform = transform
        self.mode = mode
        self.draft = draft
        self.resample = resample

    def __repr__(self) -> str:
        return f"ImageDecoder(image_size={self.image_size}, transform={self.transform!r})"

    def open(self, data: bytes | bytearray | memoryview, url: str | None = None) -> Image.Image:
        """Decode to a PIL image (resized and cropped when ``image_size`` is set)."""
        if len(data) == 0:
            raise DecodeError(
                "the object is empty (0 bytes)", url=url, stage="decode", cause=Reason.EMPTY_OBJECT
            )
        if is_raw(data):
            return self._open_raw(data, url)
        try:
            image: Image.Image = Image.open(io.BytesIO(data))
            if self.image_size is not None:
                out_h, out_w = self.image_size
                if self.draft and isinstance(image, JpegImagePlugin.JpegImageFile):
                    # Ask for the smallest DCT scale whose output still covers the crop box.
                    scale = max(out_w / image.width, out_h / image.height)
                    image.draft(
                        self.mode, (int(image.width * scale) + 1, int(image.height * scale) + 1)
                    )
                image = image.convert(self.mode) if image.mode != self.mode else image
                box = center_crop_box(image.width, image.height, out_h, out_w)
                image = image.resize((out_w, out_h), self.resample, box=box)
            else:
                image = image.convert(self.mode) if image.mode != self.mode else image
                image.load()
            return image
        except Image.DecompressionBombError as exc:
            raise DecodeError(
                f"refused as a decompression bomb: {exc} (raise PIL.Image.MAX_IMAGE_PIXELS "
                "if such images are expected)",
                url=url,
                stage="decode",
                cause=Reason.DECOMPRESSION_BOMB,
            ) from exc
        except Exception as exc:
            # Pillow raises many types for bad input (OSError, SyntaxError, ValueError,
            # struct.error, IndexError, ...): whatever it is, the object is the cause.
            raise DecodeError(
                f"not a decodable image: {type(exc).__name__}: {exc}",
                url=url,
                stage="decode",
                cause=Reason.UNDECODABLE,
            ) from exc

    def _open_raw(self, data: bytes | bytearray | memoryview, url: str | None) -> Image.Image:
        array = read_raw(data, url)
        image = Image.fromarray(array[:, :, 0] if array.shape[2] == 1 else array)
        image = image.convert(self.mode) if image.mode != self.mode else image
        if self.image_size is not None:
            out_h, out_w = self.image_size
            box = center_crop_box(image.width, image.height, out_h, out_w)
            image = image.resize((out_w, out_h), self.resample, box=box)
        return image

    def __call__(self, data: bytes | bytearray | memoryview, url: str | None = None) -> Any:
        if self.transform is None and is_raw(data):
            array = read_raw(data, url)
            if (self.mode, array.shape[2]) in (("RGB", 3), ("L", 1)):
                # No decode and no PIL image: the pixels are already what is asked for, or
                # (stored at the output's short side) a centre crop of them.
                crop = array if self.image_size is None else _exact_crop(array, self.image_size)
                if crop is not None:
                    return torch.from_numpy(np.ascontiguousarray(crop.transpose(2, 0, 1)))
        image = self.open(data, url)
        if self.transform is not None:
            return self.transform(image)
        return to_tensor(image)


def _exact_crop(array: np.ndarray, size: tuple[int, int]) -> np.ndarray | None:
    """The centre crop of ``array`` (HWC) to ``size`` when that needs no resampling (the
    image is stored at the output's short side), at whole-pixel offsets rounded as
    torchvision's ``CenterCrop`` rounds them; else None."""
    out_h, out_w = size
    left, top, right, bottom = center_crop_box(array.shape[1], array.shape[0], out_h, out_w)
    if right - left != out_w or bottom - top != out_h:
        return None
    x, y = round(left), round(top)
    return array[y : y + out_h, x : x + out_w]
