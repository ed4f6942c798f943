"""Decoding a batch of :class:`~concurrent_loader.decode.EncodedImage` in the main process.

The prefetcher's transfer (:mod:`.transfer`) replaces each top-level list of
``EncodedImage`` with a uint8 ``N, 3, h, w`` tensor, on its producer thread (on CUDA, its
copy stream). Guarantees of :class:`EncodedBatchDecoder`:

* one batched call per batch: nvJPEG (``torchvision.io.decode_jpeg``) for ``"cuda"``, the
  Pillow stand-in (:class:`~concurrent_loader.decode.PILBatchDecoder`) for ``"cpu"`` and for
  objects that are not JPEG;
* the CPU fused path's geometry (cover-resize, or the shorter side to the images'
  ``resize_size``; bilinear antialiased in float32; centre-crop), images of one shape
  together, each full-size image dropped once cropped; pixels differ by a few levels; an
  image already at the resize's size is only cropped;
* item ``i`` of the tensor is item ``i`` of the list;
* a failed batched call is retried image by image to find the culprit, which raises
  :class:`~concurrent_loader.errors.DecodeError` naming its URL; nothing is dropped or
  replaced, and the skip policy does not apply here;
* ``"cuda"`` without a CUDA device or torchvision is a ``ConfigError`` at the first batch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.nn.functional as F

from ..decode.encoded import BatchDecoder, EncodedImage, PILBatchDecoder
from ..decode.image import center_crop_offsets, resized_size
from ..decode.presize import undecodable
from ..errors import ConfigError, DecodeError
from .tree import Path, rebuild

__all__ = ["EncodedBatchDecoder", "TorchvisionDecoder", "decode_images", "is_encoded_list"]
__all__ += ["resize_crop"]

_JPEG_MAGIC = b"\xff\xd8\xff"
#: images resized in one call at most (32 images of 500 x 375 are 72 MB as float32)
_RESIZE_GROUP = 32


class TorchvisionDecoder:
    """nvJPEG through ``torchvision.io.decode_jpeg``: a list in, one batched call; a
    :class:`ConfigError` when torchvision cannot be imported."""

    def __init__(self) -> None:
        try:
            from torchvision.io import ImageReadMode, decode_jpeg
        except ImportError as exc:
            raise ConfigError(
                "decode_on='cuda' needs torchvision (torchvision.io.decode_jpeg, nvJPEG) in "
                f"the main process, and it cannot be imported ({exc}); install torchvision "
                "matching your torch, or use decode_on='cpu' or None"
            ) from exc
        self._decode_jpeg = decode_jpeg
        self._mode = ImageReadMode.RGB

    def decode(self, data: Sequence[torch.Tensor], device: torch.device) -> list[torch.Tensor]:
        out = self._decode_jpeg(list(data), mode=self._mode, device=device)
        return list(out) if isinstance(out, (list, tuple)) else [out]


def resize_crop(
    image: torch.Tensor, size: tuple[int, int], resize_size: int | None = None
) -> torch.Tensor:
    """``image`` (uint8 ``C, H, W``, or ``N, C, H, W`` of one size) resized so it covers
    ``size`` (or, with ``resize_size``, its shorter side to ``resize_size``, as
    torchvision's ``Resize`` computes it), then centre-cropped to it. An image already at
    that size is only cropped."""
    height, width = image.shape[-2:]
    out_h, out_w = size
    if resize_size is None:
        scale = max(out_w / width, out_h / height)
        new_h, new_w = max(out_h, round(height * scale)), max(out_w, round(width * scale))
    else:
        new_w, new_h = resized_size(width, height, resize_size)
    # Offsets rounded as torchvision's CenterCrop and the CPU decoder's crop round them.
    left, top = center_crop_offsets(new_w, new_h, out_h, out_w)
    if (new_h, new_w) != (height, width):
        batch = image if image.dim() == 4 else image.unsqueeze(0)
        resized = F.interpolate(batch.float(), size=(new_h, new_w), mode="bilinear", antialias=True)
        resized = resized.round_().clamp_(0, 255).to(torch.uint8)
        image = resized if image.dim() == 4 else resized[0]
    return image[..., top : top + out_h, left : left + out_w]


def is_encoded_list(value: Any) -> bool:
    """Whether ``value`` is a non-empty list or tuple of :class:`EncodedImage`."""
    return (
        isinstance(value, (list, tuple))
        and len(value) > 0
        and all(isinstance(item, EncodedImage) for item in value)
    )


class EncodedBatchDecoder:
    """Decodes lists of :class:`EncodedImage` for batches delivered on ``device``."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._fallback = PILBatchDecoder()
        self._gpu: BatchDecoder | None = None

    def _target(self, decode_on: str) -> tuple[BatchDecoder, torch.device]:
        if decode_on == "cpu":
            return self._fallback, torch.device("cpu")
        if decode_on != "cuda":
            raise ConfigError(f"unknown decode_on {decode_on!r}")
        if self.device.type != "cuda":
            why = (
                "CUDA is not available (torch.cuda.is_available() is False)"
                if not torch.cuda.is_available()
                else f"the prefetcher delivers batches on {self.device}"
            )
            raise ConfigError(
                f"decode_on='cuda' needs a CUDA device to decode on, but {why}; use "
                "decode_on='cpu' or None for the dataset"
            )
        if self._gpu is None:
            self._gpu = TorchvisionDecoder()
        return self._gpu, self.device

    def __call__(self, images: Sequence[EncodedImage]) -> torch.Tensor:
        """A uint8 ``N, 3, h, w`` tensor of ``images`` (on CUDA for ``decode_on="cuda"``,
        else on the CPU)."""
        kinds = {(image.size, image.resize_size, image.decode_on) for image in images}
        if len(kinds) != 1:
            raise ConfigError(
                "a batch mixes encoded images of different sizes, resize_size or decode_on: "
                f"{sorted(kinds, key=repr)}"
            )
        ((size, resize_size, decode_on),) = kinds
        decoder, device = self._target(decode_on)
        data = [image.tensor() for image in images]
        out = torch.empty((len(images), 3, *size), dtype=torch.uint8, device=device)
        # The GPU decoder takes JPEGs only: other images go to the fallback.
        jpeg = [decoder is self._fallback or image.startswith(_JPEG_MAGIC) for image in images]
        on_device = [i for i, ok in enumerate(jpeg) if ok]
        rest = [i for i, ok in enumerate(jpeg) if not ok]
        for indices, chosen in ((on_device, decoder), (rest, self._fallback)):
            if not indices:
                continue
            decoded: list[torch.Tensor | None] = list(
                self._decode_all(chosen, [data[i] for i in indices], device, images, indices)
            )
            # Images of one shape are resized together, a few at a time: one kernel per
            # group instead of one per image, and the float copies stay small.
            by_shape: dict[tuple[int, ...], list[int]] = {}
            for j, full in enumerate(decoded):
                assert full is not None
                by_shape.setdefault(tuple(full.shape), []).append(j)
            for group in by_shape.values():
                for start in range(0, len(group), _RESIZE_GROUP):
                    js = group[start : start + _RESIZE_GROUP]
                    fulls = torch.stack([decoded[j] for j in js])  # type: ignore[misc]
                    for j in js:
                        decoded[j] = None  # full-size images are freed once cropped
                    crops = resize_crop(fulls, size, resize_size)
                    del fulls
                    for j, crop in zip(js, crops, strict=True):
                        out[indices[j]].copy_(crop)
        return out

    def _decode_all(
        self,
        decoder: BatchDecoder,
        data: list[torch.Tensor],
        device: torch.device,
        images: Sequence[EncodedImage],
        indices: list[int],
    ) -> list[torch.Tensor]:
        try:
            decoded = decoder.decode(data, device)
            if len(decoded) == len(data):
                return decoded
        except Exception:
            pass
        # The batched call failed: decode one by one to name the object at fault.
        return [
            self._decode_one(decoder, d, device, images[i])
            for d, i in zip(data, indices, strict=True)
        ]

    def _decode_one(
        self, decoder: BatchDecoder, data: torch.Tensor, device: torch.device, image: EncodedImage
    ) -> torch.Tensor:
        try:
            return decoder.decode([data], device)[0]
        except Exception as exc:
            first: BaseException = exc
        if decoder is not self._fallback:
            try:
                return self._fallback.decode([data], torch.device("cpu"))[0].to(device)
            except Exception as exc:
                first = exc
        if isinstance(first, DecodeError):
            raise first.for_object(image.url or "?") from first.__cause__
        raise undecodable(first, image.url) from first


def decode_images(batch: Any, decoder: EncodedBatchDecoder) -> tuple[Any, frozenset[Path]]:
    """``batch`` with every top-level list of :class:`EncodedImage` decoded, and the paths
    of the tensors that replaced them. A batch without one is returned as it is."""
    if is_encoded_list(batch):
        return decoder(batch), frozenset({()})
    items: dict[Any, Any] | list[Any]
    if isinstance(batch, Mapping):
        items = dict(batch)
        keys: list[Any] = list(items)
    elif isinstance(batch, (list, tuple)):
        items = list(batch)
        keys = list(range(len(items)))
    else:
        return batch, frozenset()
    where = [key for key in keys if is_encoded_list(items[key])]
    if not where:
        return batch, frozenset()
    for key in where:
        items[key] = decoder(items[key])
    return rebuild(batch, items), frozenset((key,) for key in where)
