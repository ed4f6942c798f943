"""Encoded images: workers ship a sample's JPEG bytes, the main process decodes the batch.

With ``decode_on`` the worker-side decoder (:class:`EncodedImageDecoder`) returns an
:class:`EncodedImage`: the object's bytes (a ``bytes`` subclass, kept as is by
``default_collate``) with the target size, the URL and ``decode_on``; its attributes survive
pickling, under every start method. :class:`~concurrent_loader.gpu.CUDAPrefetcher` decodes
the batch's list in one call (:mod:`concurrent_loader.gpu.decode`): nvJPEG for ``"cuda"``,
the :class:`PILBatchDecoder` stand-in on one thread for ``"cpu"`` (for tests, not speed).

The worker parses only the header: an object that is not an image is a
:class:`~concurrent_loader.errors.DecodeError` in the worker, under the skip policy. Data
that fails only when decoded raises a ``DecodeError`` naming the URL in the main process
and ends the pass, whatever ``on_error`` says (nothing is dropped or replaced silently).
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from typing import Any, Literal, Protocol

import torch
from PIL import Image

from ..errors import ConfigError
from .image import ImageDecoder, check_image_size, check_resize_size
from .presize import check_not_empty, is_raw, read_raw, undecodable

__all__ = [
    "DECODE_ON",
    "BatchDecoder",
    "DecodeOn",
    "EncodedImage",
    "EncodedImageDecoder",
    "PILBatchDecoder",
    "check_decode_on",
    "image_decoder",
]

DecodeOn = Literal["cuda", "cpu"]
#: the accepted values of ``decode_on`` (``None`` means: decode in the worker, as before)
DECODE_ON: tuple[str, ...] = ("cuda", "cpu")


class EncodedImage(bytes):
    """An image object's bytes, with what the batch decode needs: ``size`` (the output
    ``(h, w)``), ``url`` (named by errors), ``decode_on`` (``"cuda"`` or ``"cpu"``) and
    ``resize_size`` (the shorter side resized to before the crop; None: the crop's)."""

    size: tuple[int, int]
    url: str | None
    decode_on: str
    resize_size: int | None

    def __new__(
        cls,
        data: bytes | bytearray | memoryview,
        size: tuple[int, int],
        url: str | None = None,
        decode_on: str = "cuda",
        resize_size: int | None = None,
    ) -> EncodedImage:
        self = super().__new__(cls, data)
        self.size = (int(size[0]), int(size[1]))
        self.url = url
        self.decode_on = decode_on
        self.resize_size = resize_size
        return self

    def __reduce__(self) -> tuple[Any, ...]:
        return (
            EncodedImage,
            (bytes(self), self.size, self.url, self.decode_on, self.resize_size),
        )

    def __repr__(self) -> str:
        resize = "" if self.resize_size is None else f", resize_size={self.resize_size}"
        return (
            f"EncodedImage({len(self)} bytes, size={self.size}{resize}, url={self.url!r}, "
            f"decode_on={self.decode_on!r})"
        )

    __str__ = __repr__  # bytes' own str() would print every byte

    def tensor(self) -> torch.Tensor:
        """The bytes as a 1-D uint8 CPU tensor (a copy), what batch decoders take."""
        return torch.frombuffer(bytearray(self), dtype=torch.uint8)


def check_decode_on(decode_on: str | None, image_size: Any, transform: Any) -> None:
    """Raise :class:`ConfigError` for a ``decode_on`` that cannot work with these options."""
    if decode_on is None:
        return
    if decode_on not in DECODE_ON:
        raise ConfigError(f"decode_on must be one of {DECODE_ON} or None, got {decode_on!r}")
    if image_size is None:
        raise ConfigError(
            f"decode_on={decode_on!r} needs image_size: a batch is decoded to one size"
        )
    if transform is not None:
        raise ConfigError(
            f"decode_on={decode_on!r} cannot take a transform: the worker no longer has a "
            "PIL image to give it"
        )


class EncodedImageDecoder:
    """Worker-side decoder of ``decode_on``: checks the header, returns an
    :class:`EncodedImage` (see the module docstring for what is checked where)."""

    def __init__(
        self,
        image_size: int | tuple[int, int],
        decode_on: str = "cuda",
        *,
        resize_size: int | None = None,
    ) -> None:
        check_decode_on(decode_on, image_size, None)
        self.image_size = check_image_size(image_size)
        self.decode_on = decode_on
        self.resize_size = check_resize_size(resize_size, self.image_size)

    def __repr__(self) -> str:
        resize = "" if self.resize_size is None else f", resize_size={self.resize_size}"
        return (
            f"EncodedImageDecoder(image_size={self.image_size}{resize}, "
            f"decode_on={self.decode_on!r})"
        )

    def __call__(
        self, data: bytes | bytearray | memoryview, url: str | None = None
    ) -> EncodedImage:
        check_not_empty(data, url)
        if is_raw(data):
            read_raw(data, url)  # the header and length; the batch decoder's fallback reads it
        else:
            try:
                with Image.open(io.BytesIO(data)):  # reads the header only
                    pass
            except Exception as exc:
                raise undecodable(exc, url) from exc
        return EncodedImage(data, self.image_size, url, self.decode_on, self.resize_size)


def image_decoder(
    image_size: int | tuple[int, int] | None = None,
    *,
    transform: Any = None,
    decode_on: str | None = None,
    resize_size: int | None = None,
) -> ImageDecoder | EncodedImageDecoder:
    """The image decoder of a dataset's options (``ImageFolder``, ``ImageSample``): the
    worker-side :class:`EncodedImageDecoder` with ``decode_on``, else :class:`ImageDecoder`;
    :class:`ConfigError` or ``ValueError`` for options that cannot work together."""
    check_decode_on(decode_on, image_size, transform)
    if decode_on is not None and image_size is not None:
        return EncodedImageDecoder(image_size, decode_on, resize_size=resize_size)
    return ImageDecoder(image_size, transform=transform, resize_size=resize_size)


class BatchDecoder(Protocol):
    """Decodes a batch of encoded images: 1-D uint8 CPU tensors in, full-size uint8 CHW
    RGB tensors on ``device`` out, one per input, in order. Raises on any failure; the
    caller finds the culprit by decoding one at a time."""

    def decode(self, data: Sequence[torch.Tensor], device: torch.device) -> list[torch.Tensor]: ...


class PILBatchDecoder:
    """The CPU stand-in: Pillow (through :class:`ImageDecoder`), one image after another.

    Also the fallback of the GPU decoders for what they cannot read (PNG and other formats
    than JPEG, the raw form of :mod:`.presize`, or a JPEG the GPU decoder refuses but Pillow
    reads)."""

    def __init__(self) -> None:
        self._decoder = ImageDecoder(None)

    def decode(self, data: Sequence[torch.Tensor], device: torch.device) -> list[torch.Tensor]:
        return [self._decoder(item.numpy().tobytes()).to(device) for item in data]
