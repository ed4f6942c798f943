"""Pre-sizing: an image stored once at a smaller size, so that each epoch decodes less.

:class:`Presize` turns the bytes of any image Pillow can read into either a JPEG whose
shorter side is ``short_side`` (``format="jpeg"``) or the same pixels undecoded
(``format="raw"``). :class:`~concurrent_loader.decode.image.ImageDecoder` reads both: a
JPEG is a JPEG, and the raw form needs no decode at all.

What :meth:`Presize.apply` does, in order:

1. EXIF orientation is applied (``ImageOps.exif_transpose``), so the stored pixels are
   upright and carry no orientation tag.
2. Modes are brought to 8-bit RGB: 16-bit and 32-bit integer greyscale (``I;16*``, ``I``)
   is scaled to 0-255 (value / 257, not clipped), CMYK / YCbCr / LAB / palette / 1-bit /
   greyscale are converted with Pillow's ``convert("RGB")``. **Alpha is dropped**: the
   colour channels are kept as stored, not composited on a background, which is what
   ``ImageDecoder``'s ``convert("RGB")`` does with the original, so the pre-sized sample
   matches the one the loader made before. ICC profiles are neither applied nor kept.
3. The image is resized so that its shorter side is ``short_side``, the aspect ratio kept
   (the longer side rounded to the nearest pixel). An image whose shorter side is already
   ``short_side`` or less is never upscaled (it is still re-encoded, upright and in RGB).
   A JPEG is first decoded at a reduced DCT scale (``draft``) that still leaves at least
   twice the target size, then resized with ``LANCZOS``: the quality of a full LANCZOS
   resize at a fraction of the decode time.
4. The output is written with fixed settings and no metadata (no EXIF, ICC, DPI or
   timestamps): the same input gives the same bytes. JPEG: baseline, 4:2:0 chroma
   subsampling, optimised Huffman tables, ``quality``.

The raw form (``format="raw"``) is a 16-byte header, then the pixels::

    offset  size  field
    0       4     magic  b"CLRW"
    4       1     version: 2
    5       1     channels (1, 3 or 4; Presize writes 3, RGB)
    6       2     reserved, zero
    8       4     height, unsigned little-endian
    12      4     width, unsigned little-endian
    16      h*w*c pixels, uint8, CHW (numpy's C order of a (c, h, w) array, one plane per
                  channel)

Planes, because the loader's tensors are CHW: a centre crop of planes is a copy of rows,
where a crop of interleaved pixels pays a transpose too (0.017 against 0.073 ms for 224 x
224 RGB, measured). :func:`is_raw` recognises the form, :func:`read_raw` gives a zero-copy
``(h, w, c)`` uint8 view of it (a strided view of the planes).
"""

from __future__ import annotations

import io
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

import numpy as np
from PIL import Image, ImageOps, JpegImagePlugin

from ..config import check_count
from ..errors import ConfigError, DecodeError, Reason

__all__ = ["FORMATS", "RAW_HEADER_SIZE", "RAW_MAGIC", "Presize", "is_raw", "read_raw", "write_raw"]
__all__ += ["check_not_empty", "undecodable"]

#: the output forms :class:`Presize` makes
FORMATS = ("jpeg", "raw")
RAW_MAGIC = b"CLRW"
#: the version written and read: channel planes (CHW)
RAW_VERSION = 2
_HEADER = struct.Struct("<4sBBHII")
RAW_HEADER_SIZE = _HEADER.size  # 16
_RAW_CHANNELS = (1, 3, 4)
_ORIENTATION = 0x0112  # the EXIF tag
_SWAPS_SIDES = (5, 6, 7, 8)  # orientations that transpose the image
#: a JPEG is draft-decoded to at least this many times the target size before LANCZOS
_DRAFT_MARGIN = 2


@dataclass(frozen=True)
class Presize:
    """How images are pre-sized: shorter side ``short_side`` (never upscaled, aspect kept),
    stored as a re-encoded JPEG of ``quality`` or as raw uint8 pixels (``format="raw"``)."""

    short_side: int
    format: str = "jpeg"
    quality: int = 90

    def __post_init__(self) -> None:
        check_count("Presize.short_side", self.short_side)
        if self.format not in FORMATS:
            raise ConfigError(f"Presize.format must be one of {FORMATS}, got {self.format!r}")
        check_count("Presize.quality", self.quality)
        if self.quality > 100:
            raise ConfigError(f"Presize.quality must be in 1..100, got {self.quality}")

    @property
    def identity(self) -> str:
        """A stable name of this setting (caches and shard indexes key on it): the same
        setting always gives the same bytes, so equal identities mean equal outputs."""
        if self.format == "raw":
            return f"presize-v2:raw:{self.short_side}"  # v2: the raw form's planes
        return f"presize-v1:jpeg:{self.short_side}:q{self.quality}"

    def target(self, width: int, height: int) -> tuple[int, int]:
        """The (width, height) an image of this size is stored at."""
        short = min(width, height)
        if short <= self.short_side:
            return width, height
        scale = self.short_side / short
        if width <= height:
            return self.short_side, max(1, round(height * scale))
        return max(1, round(width * scale)), self.short_side

    def apply(self, data: bytes | bytearray | memoryview, url: str | None = None) -> bytes:
        """The pre-sized form of the image in ``data``; :class:`DecodeError` naming ``url``
        when ``data`` is not a decodable image (empty, truncated, not an image)."""
        return self.apply_sized(data, url)[0]

    def apply_sized(
        self, data: bytes | bytearray | memoryview, url: str | None = None
    ) -> tuple[bytes, tuple[int, int]]:
        """:meth:`apply`, and the image's ``(width, height)`` before it (upright: after its
        EXIF orientation)."""
        image, original = _open_upright(data, url, self._draft_size)
        try:
            image = _to_rgb(image)
            size = self.target(image.width, image.height)
            if size != image.size:
                image = image.resize(size, Image.Resampling.LANCZOS)
        except Exception as exc:
            raise undecodable(exc, url) from exc
        if self.format == "raw":
            return write_raw(np.asarray(image)), original
        out = io.BytesIO()
        image.info = {}  # Pillow carries some (a JPEG comment) from the input unless emptied
        image.save(
            out,
            "JPEG",
            quality=self.quality,
            subsampling="4:2:0",
            optimize=True,
            progressive=False,
        )
        return out.getvalue(), original

    def _draft_size(self, width: int, height: int) -> tuple[int, int]:
        w, h = self.target(width, height)
        return min(width, w * _DRAFT_MARGIN), min(height, h * _DRAFT_MARGIN)


def check_not_empty(data: bytes | bytearray | memoryview, url: str | None) -> None:
    if len(data) == 0:
        raise DecodeError(
            "the object is empty (0 bytes)", url=url, stage="decode", cause=Reason.EMPTY_OBJECT
        )


def undecodable(exc: BaseException, url: str | None) -> DecodeError:
    """What Pillow (or a transform) raised for bad input, as the ``DecodeError`` naming the
    object: Pillow raises many types (OSError, SyntaxError, ValueError, struct.error, ...),
    and whatever it is, the object is the cause."""
    if isinstance(exc, DecodeError):
        return exc if exc.url is not None or url is None else cast(DecodeError, exc.for_object(url))
    if isinstance(exc, Image.DecompressionBombError):
        return DecodeError(
            f"refused as a decompression bomb: {exc} (raise PIL.Image.MAX_IMAGE_PIXELS "
            "if such images are expected)",
            url=url,
            stage="decode",
            cause=Reason.DECOMPRESSION_BOMB,
        )
    return DecodeError(
        f"not a decodable image: {type(exc).__name__}: {exc}",
        url=url,
        stage="decode",
        cause=Reason.UNDECODABLE,
    )


def _open_upright(
    data: bytes | bytearray | memoryview,
    url: str | None,
    draft_size: Callable[[int, int], tuple[int, int]],
) -> tuple[Image.Image, tuple[int, int]]:
    """Decode ``data`` (an image file or the raw form), fully loaded and EXIF-upright; and
    its upright ``(width, height)`` at full size (a JPEG may be decoded smaller)."""
    check_not_empty(data, url)
    if is_raw(data):
        array = read_raw(data, url)
        pixels = Image.fromarray(array[:, :, 0] if array.shape[2] == 1 else array)
        return pixels, pixels.size
    try:
        image: Image.Image = Image.open(io.BytesIO(data))
        width, height = image.size
        if image.getexif().get(_ORIENTATION, 1) in _SWAPS_SIDES:
            width, height = height, width
        if isinstance(image, JpegImagePlugin.JpegImageFile):
            # Orientation may swap width and height, but not which side is shorter.
            image.draft(image.mode, draft_size(image.width, image.height))
        image.load()
        upright = ImageOps.exif_transpose(image)
        return (upright if upright is not None else image), (width, height)
    except Exception as exc:
        raise undecodable(exc, url) from exc


def _to_rgb(image: Image.Image) -> Image.Image:
    if image.mode == "RGB":
        return image
    if image.mode.startswith("I;16") or image.mode == "I":
        # 16-bit greyscale: scale, don't clip (Pillow's convert clips at 255).
        wide = np.asarray(image).astype(np.uint32)
        narrow = ((wide + 128) // 257).clip(0, 255).astype(np.uint8)
        return Image.fromarray(narrow).convert("RGB")
    if image.mode == "F":
        return Image.fromarray(np.asarray(image).clip(0, 255).astype(np.uint8)).convert("RGB")
    # P with transparency, PA, LA, RGBA, RGBa: alpha dropped, colour kept (see the docstring).
    if image.mode in ("P", "PA"):
        image = image.convert("RGBA")
    return image.convert("RGB")


def write_raw(array: np.ndarray) -> bytes:
    """The raw form (version 2, planes) of an ``(h, w)`` or ``(h, w, c)`` uint8 array."""
    if array.dtype != np.uint8:
        raise ValueError(f"the raw form holds uint8 pixels, got {array.dtype}")
    if array.ndim == 2:
        array = array[:, :, None]
    if array.ndim != 3 or array.shape[2] not in _RAW_CHANNELS:
        raise ValueError(
            f"the raw form holds (h, w, c) with c in {_RAW_CHANNELS}, got {array.shape}"
        )
    h, w, c = array.shape
    header = _HEADER.pack(RAW_MAGIC, RAW_VERSION, c, 0, h, w)
    return header + np.ascontiguousarray(array.transpose(2, 0, 1)).tobytes()


def is_raw(data: bytes | bytearray | memoryview) -> bool:
    """Whether ``data`` starts with the raw form's magic (:func:`read_raw` checks the rest)."""
    return len(data) >= RAW_HEADER_SIZE and bytes(data[:4]) == RAW_MAGIC


def read_raw(data: bytes | bytearray | memoryview, url: str | None = None) -> np.ndarray:
    """An ``(h, w, c)`` uint8 view of the raw form in ``data`` (no copy; read-only when
    ``data`` is ``bytes``; not contiguous, its ``transpose(2, 0, 1)`` is);
    :class:`DecodeError` naming ``url`` when it is malformed."""

    def malformed(why: str) -> DecodeError:
        return DecodeError(
            f"malformed raw image: {why}", url=url, stage="decode", cause=Reason.UNDECODABLE
        )

    if len(data) < RAW_HEADER_SIZE:
        raise malformed(f"{len(data)} bytes, shorter than the {RAW_HEADER_SIZE}-byte header")
    magic, version, c, reserved, h, w = _HEADER.unpack_from(data, 0)
    if magic != RAW_MAGIC:
        raise malformed(f"magic {magic!r}, expected {RAW_MAGIC!r}")
    if version != RAW_VERSION:
        raise malformed(f"version {version}, this reader knows {RAW_VERSION}")
    if c not in _RAW_CHANNELS or reserved != 0 or h == 0 or w == 0:
        raise malformed(f"header says {h}x{w}x{c} (reserved {reserved})")
    expected = RAW_HEADER_SIZE + h * w * c
    if len(data) != expected:
        raise malformed(f"{len(data)} bytes, the header's {h}x{w}x{c} needs {expected}")
    pixels = np.frombuffer(data, dtype=np.uint8, count=h * w * c, offset=RAW_HEADER_SIZE)
    return pixels.reshape(c, h, w).transpose(1, 2, 0)
