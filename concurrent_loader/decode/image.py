"""Image decoding: bytes in, a uint8 CHW tensor (or a user transform's output) out.

The fused path (``image_size`` given) decodes a JPEG at a reduced DCT scale when the target
is smaller, then resizes and centre-crops in one ``Image.resize(box=...)``. Its geometry:

- ``resize_size`` None: the largest centred box with the output's aspect ratio, resized to
  ``image_size`` (torchvision's ``Resize(s) + CenterCrop(s)`` up to sub-pixel rounding);
- ``resize_size`` R: torchvision's ``Resize(R) + CenterCrop(image_size)`` on a PIL image,
  pixel for pixel (shorter side to R, longer side truncated, crop offsets rounded; only the
  crop's columns go through the vertical pass); the standard ImageNet evaluation pipeline
  is ``resize_size=256, image_size=224``. A JPEG decoded at a reduced DCT scale (draft mode,
  the largest 1/2^k scale not below the resize) is close to it, not equal.

An image that needs no resample (its size is already the resize's: stored pre-sized at the
output's short side, or at ``resize_size``) is only cropped, at whole-pixel offsets
rounded as torchvision's ``CenterCrop`` rounds them. Pillow releases the GIL, so threads
scale.

With ``simplejpeg`` (a dependency; Pillow alone where it is missing), a YCbCr or greyscale JPEG
made into a tensor with no resample (the whole image, or a crop: one stored pre-sized) is
decoded by it, straight to an array: the same libjpeg-turbo with the same settings
(accurate integer DCT, fancy upsampling), so the same pixels (tests compare them), without
Pillow's chunked feed and 4-byte pixels (0.71 against 0.96 ms for a 341x256 JPEG,
measured). An image to resize stays with Pillow (making a PIL image of the array costs
what the decode saves), and so does anything else (CMYK, which Pillow converts its own
way; a file libjpeg-turbo warns about, such as a truncated one), whose error names the
object.

The raw form of :mod:`.presize` (uint8 pixels with their shape) is read without a decode:
the fused path crops (and resizes when it must) from the array with the same geometry as
for a JPEG, a ``transform`` gets a PIL image made from the array, and with neither the
array itself becomes the tensor.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from PIL import Image, JpegImagePlugin

from ..errors import ConfigError
from .presize import check_not_empty, is_raw, read_raw, undecodable

try:
    import simplejpeg
except ImportError:  # the optional extra: Pillow decodes every JPEG
    simplejpeg = None

__all__ = [
    "ImageDecoder",
    "center_crop_box",
    "center_crop_offsets",
    "check_image_size",
    "check_resize_size",
    "resized_size",
    "to_tensor",
]

Box = tuple[float, float, float, float]
#: modes whose channels Pillow packs one by one (rawmode = band name)
_PLANAR_MODES = ("RGB", "L")


def center_crop_box(width: int, height: int, out_h: int, out_w: int) -> Box:
    """The source box that, resized to ``(out_w, out_h)``, equals resize-shorter-side then
    centre-crop: the largest centred box with the output's aspect ratio."""
    scale = max(out_w / width, out_h / height)
    box_w, box_h = out_w / scale, out_h / scale
    # Clamp: float rounding may put an edge a hair outside the image, which Pillow refuses.
    left, top = max(0.0, (width - box_w) / 2), max(0.0, (height - box_h) / 2)
    return (left, top, min(float(width), left + box_w), min(float(height), top + box_h))


def resized_size(width: int, height: int, resize_size: int) -> tuple[int, int]:
    """``(width, height)`` after torchvision's ``Resize(resize_size)``: the shorter side
    becomes ``resize_size``, the longer side keeps the aspect ratio, truncated."""
    if width <= height:
        return resize_size, int(resize_size * height / width)
    return int(resize_size * width / height), resize_size


def center_crop_offsets(width: int, height: int, out_h: int, out_w: int) -> tuple[int, int]:
    """``(left, top)`` of torchvision's ``CenterCrop((out_h, out_w))`` of an image this
    size (Python's ``round``: 37.5 -> 38, 36.5 -> 36)."""
    return round((width - out_w) / 2.0), round((height - out_h) / 2.0)


def check_image_size(image_size: int | tuple[int, int]) -> tuple[int, int]:
    """``image_size`` (an int, or ``(h, w)``) as ``(h, w)``; ``ValueError`` unless positive."""
    size = (image_size, image_size) if isinstance(image_size, int) else tuple(image_size)
    if len(size) != 2 or min(size) < 1:
        raise ValueError(f"image_size must be a positive int or (h, w), got {image_size!r}")
    return int(size[0]), int(size[1])


def check_resize_size(resize_size: Any, image_size: tuple[int, int] | None) -> int | None:
    """``resize_size`` validated against ``image_size`` (the crop): ``ConfigError`` when it
    is not a positive int, given without ``image_size``, or smaller than the crop."""
    if resize_size is None:
        return None
    if isinstance(resize_size, bool) or not isinstance(resize_size, int):
        raise ConfigError(f"resize_size must be an int (the shorter side), got {resize_size!r}")
    if image_size is None:
        raise ConfigError(f"resize_size={resize_size} needs image_size (the crop after it)")
    if resize_size < max(image_size):
        # torchvision would pad the crop with zeros; a training pipeline never means that.
        raise ConfigError(
            f"resize_size={resize_size} is smaller than the crop image_size={image_size}"
        )
    return resize_size


def to_tensor(image: Image.Image) -> torch.Tensor:
    """Contiguous uint8 CHW tensor of an RGB or L image.

    CHW is made here, per image on a decode thread: stacking permuted views into a batch
    instead costs a strided copy per batch on the consumer's thread (measured: about 10x
    slower than stacking contiguous images). For RGB and L, Pillow packs each channel's
    plane straight from its pixels, which costs less than an HWC array and its transpose
    (0.06 against 0.16 ms for 224x224 RGB, measured).
    """
    if image.mode in _PLANAR_MODES:
        bands = image.getbands()
        planes = bytearray(b"".join(image.tobytes("raw", band) for band in bands))
        return torch.frombuffer(planes, dtype=torch.uint8).view(
            len(bands), image.height, image.width
        )
    return _chw(np.asarray(image))


def _chw(array: np.ndarray) -> torch.Tensor:
    if array.ndim == 2:
        array = array[:, :, None]
    # A copy always: for one channel (or the raw form's planes) the transpose is already
    # contiguous, and PIL's array (or a view of bytes) is read-only.
    return torch.from_numpy(array.transpose(2, 0, 1).copy())


class ImageDecoder:
    """Callable decoding image bytes.

    - ``image_size`` None and no ``transform``: the full image as a uint8 CHW tensor;
    - ``image_size`` (int or (h, w)): fused draft-decode, resize and centre-crop to that
      size; with ``resize_size`` R, the shorter side is resized to R first (torchvision's
      ``Resize(R) + CenterCrop(image_size)``, see the module docstring);
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
        resize_size: int | None = None,
    ) -> None:
        self.image_size = None if image_size is None else check_image_size(image_size)
        self.resize_size = check_resize_size(resize_size, self.image_size)
        self.transform = transform
        self.mode = mode
        self.draft = draft
        self.resample = resample

    def __repr__(self) -> str:
        resize = "" if self.resize_size is None else f", resize_size={self.resize_size}"
        return f"ImageDecoder(image_size={self.image_size}{resize}, transform={self.transform!r})"

    def geometry(self, width: int, height: int) -> tuple[Box, tuple[int, int] | None]:
        """For an image of ``width`` x ``height``: the source box resized to ``image_size``,
        and ``(left, top)`` when that box needs no resample (a crop at those offsets)."""
        assert self.image_size is not None
        out_h, out_w = self.image_size
        if self.resize_size is None:
            box = center_crop_box(width, height, out_h, out_w)
            if box[2] - box[0] != out_w or box[3] - box[1] != out_h:
                return box, None
            left, top = round(box[0]), round(box[1])
        else:
            new_w, new_h = resized_size(width, height, self.resize_size)
            left, top = center_crop_offsets(new_w, new_h, out_h, out_w)
            if (new_w, new_h) != (width, height):
                sx, sy = width / new_w, height / new_h
                return (left * sx, top * sy, (left + out_w) * sx, (top + out_h) * sy), None
        return (left, top, left + out_w, top + out_h), (left, top)

    def _draft_size(self, width: int, height: int) -> tuple[int, int]:
        """The smallest decoded size the resize may start from (JPEG ``draft`` picks the
        largest 1/2^k scale whose output is not below it)."""
        assert self.image_size is not None
        if self.resize_size is not None:
            return resized_size(width, height, self.resize_size)
        out_h, out_w = self.image_size
        scale = max(out_w / width, out_h / height)
        return int(width * scale) + 1, int(height * scale) + 1

    def _decode(
        self, data: bytes | bytearray | memoryview, url: str | None
    ) -> tuple[Image.Image, tuple[int, int] | None]:
        """The image in ``data``, in ``self.mode``: the output when ``image_size`` is set,
        or, with offsets, the image to crop the output from at those offsets."""
        check_not_empty(data, url)
        if is_raw(data):
            return self._fit_array(read_raw(data, url))
        try:
            image: Image.Image = Image.open(io.BytesIO(data))
            width, height = image.size
            jpeg = isinstance(image, JpegImagePlugin.JpegImageFile)
            if jpeg and self.draft and self.image_size is not None:
                image.draft(self.mode, self._draft_size(width, height))
            image.load()  # here, so that bad data is named even when only a crop follows
            image = image.convert(self.mode) if image.mode != self.mode else image
            return self._fit(image, (width, height))
        except Exception as exc:
            raise undecodable(exc, url) from exc

    def _fit_array(self, array: np.ndarray) -> tuple[Image.Image, tuple[int, int] | None]:
        image = Image.fromarray(array[:, :, 0] if array.shape[2] == 1 else array)
        return self._fit(image.convert(self.mode) if image.mode != self.mode else image)

    def _fit(
        self, image: Image.Image, original: tuple[int, int] | None = None
    ) -> tuple[Image.Image, tuple[int, int] | None]:
        """``image`` resized to ``image_size`` (its geometry taken from its ``original``
        size, which draft mode may have reduced), or the image and the offsets to crop the
        output from."""
        if self.image_size is None:
            return image, None
        width, height = original or image.size
        box, crop = self.geometry(width, height)
        if image.size == (width, height):
            if crop is not None:
                return image, crop
            if self.resize_size is not None:
                return self._resize_exactly(image)
        else:  # decoded at a reduced DCT scale: the box in its pixels
            fx, fy = image.width / width, image.height / height
            box = (
                box[0] * fx,
                box[1] * fy,
                min(float(image.width), box[2] * fx),
                min(float(image.height), box[3] * fy),
            )
        out_h, out_w = self.image_size
        return image.resize((out_w, out_h), self.resample, box=box), None

    def _resize_exactly(self, image: Image.Image) -> tuple[Image.Image, tuple[int, int]]:
        """torchvision's ``Resize(resize_size)`` then ``CenterCrop(image_size)``: the whole
        image resized, and the crop's offsets. (Resizing only the crop's box, or rows then
        the crop's columns, is cheaper but moves some pixels by a level: Pillow's sample
        positions and its order of passes depend on the box and the aspect.)"""
        assert self.image_size is not None and self.resize_size is not None
        out_h, out_w = self.image_size
        width, height = image.size
        new_w, new_h = resized_size(width, height, self.resize_size)
        if (new_w, new_h) != (width, height):
            image = image.resize((new_w, new_h), self.resample)
        return image, center_crop_offsets(new_w, new_h, out_h, out_w)

    def open(self, data: bytes | bytearray | memoryview, url: str | None = None) -> Image.Image:
        """Decode to a PIL image (resized and cropped when ``image_size`` is set)."""
        return self._crop(*self._decode(data, url))

    def _crop(self, image: Image.Image, crop: tuple[int, int] | None) -> Image.Image:
        if crop is None:
            return image
        assert self.image_size is not None
        (left, top), (out_h, out_w) = crop, self.image_size
        return image.crop((left, top, left + out_w, top + out_h))

    def _pixels(self, data: bytes | bytearray | memoryview, url: str | None) -> Any:
        """The ``(h, w, c)`` uint8 pixels of the raw form, or of a JPEG that ``simplejpeg``
        decodes as Pillow would and that needs no resample (see the module docstring);
        None for Pillow to decode."""
        if is_raw(data):
            return read_raw(data, url)
        if simplejpeg is None or self.mode != "RGB" or bytes(data[:2]) != b"\xff\xd8":
            return None
        try:
            height, width, colorspace, _ = simplejpeg.decode_jpeg_header(data)
            limit = Image.MAX_IMAGE_PIXELS
            if colorspace not in ("YCbCr", "Gray") or (limit and width * height > limit):
                return None  # Pillow converts CMYK its own way; its refusal names a bomb
            if self.image_size is not None and self.geometry(width, height)[1] is None:
                return None  # a resample (and perhaps a draft) by Pillow
            return simplejpeg.decode_jpeg(data, colorspace="RGB")
        except ValueError:
            return None

    def __call__(self, data: bytes | bytearray | memoryview, url: str | None = None) -> Any:
        if self.transform is not None:
            return self.transform(self.open(data, url))
        array = self._pixels(data, url) if len(data) else None
        if array is not None and (self.mode, array.shape[2]) in (("RGB", 3), ("L", 1)):
            # No PIL image: the pixels are already what is asked for, or a centre crop.
            if self.image_size is None:
                return _chw(array)
            _, crop = self.geometry(array.shape[1], array.shape[0])
            if crop is not None:
                (left, top), (out_h, out_w) = crop, self.image_size
                return _chw(array[top : top + out_h, left : left + out_w])
            return to_tensor(self._crop(*self._fit_array(array)))
        return to_tensor(self.open(data, url))
