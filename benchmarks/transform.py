"""The one decode every configuration pays: JPEG bytes to a uint8 CHW tensor.

A loader comparison is only fair when every loader does the same CPU work per image, so
the stock and peer configurations decode with :func:`make_decoder`: the very decoder that
``ImageFolder(..., image_size=N)`` uses (``concurrent_loader.decode.ImageDecoder``), or,
where that does not import, :func:`decode_image`, which does the same work: a
reduced-size JPEG decode (``Image.draft``) that keeps the shorter side at least ``N``, a
resize of the shorter side to ``N`` and a centre crop to ``N x N``.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from functools import partial

import numpy as np
import torch
from PIL import Image


def decode_image(data: bytes | bytearray | memoryview, image_size: int) -> torch.Tensor:
    """Decode JPEG ``data`` to a ``uint8`` tensor of shape ``[3, image_size, image_size]``."""
    with Image.open(io.BytesIO(data)) as img:
        # draft() lets libjpeg skip DCT work by decoding at 1/2, 1/4 or 1/8 scale while
        # both sides stay >= the requested size; it is what makes small outputs cheap.
        img.draft("RGB", (image_size, image_size))
        rgb = img.convert("RGB")
    w, h = rgb.size
    scale = image_size / min(w, h)
    new_w, new_h = max(image_size, round(w * scale)), max(image_size, round(h * scale))
    if (new_w, new_h) != (w, h):
        rgb = rgb.resize((new_w, new_h), Image.Resampling.BILINEAR)
    left, top = (new_w - image_size) // 2, (new_h - image_size) // 2
    rgb = rgb.crop((left, top, left + image_size, top + image_size))
    # np.array copies into a writable buffer, which torch.from_numpy requires.
    return torch.from_numpy(np.array(rgb, dtype=np.uint8)).permute(2, 0, 1).contiguous()


def make_decoder(image_size: int) -> Callable[[bytes | bytearray | memoryview], torch.Tensor]:
    """A picklable callable decoding JPEG bytes to ``uint8 [3, image_size, image_size]``."""
    try:
        from concurrent_loader.decode import ImageDecoder
    except ImportError:
        return partial(decode_image, image_size=image_size)
    return ImageDecoder(image_size)
