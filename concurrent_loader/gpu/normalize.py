"""The image conversion done on the device after the copy: uint8 -> float, normalise, layout.

Images cross the bus as uint8 (a quarter of float32's bytes). Only the image leaf is
touched: a ``uint8`` tensor of 3 or 4 dimensions (with ``mean``, ``len(mean)`` channels) at
one of ``keys`` at the batch's top level, or a bare tensor batch. With ``mean`` and ``std``
(0-1 units) it becomes ``(x / 255 - mean) / std`` in ``dtype``, computed in float32 (float64
for float64) and rounded once; with ``channels_last`` a 4-dimensional image comes out in
``torch.channels_last`` in the same pass.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import torch

from ..errors import ConfigError
from .tree import Path

__all__ = ["DEFAULT_IMAGE_KEYS", "DeviceImageTransform", "ImageTransform"]

#: where the image is found by default: first element of a tuple/list, or a dict key
DEFAULT_IMAGE_KEYS: tuple[int | str, ...] = (0, "image", "images")


@dataclass(frozen=True)
class ImageTransform:
    """What to do to the image leaf of each batch; validated at construction."""

    mean: tuple[float, ...] | None = None
    std: tuple[float, ...] | None = None
    dtype: torch.dtype = torch.float32
    channels_last: bool = False
    keys: tuple[Hashable, ...] = DEFAULT_IMAGE_KEYS

    def __post_init__(self) -> None:
        if (self.mean is None) != (self.std is None):
            raise ConfigError("mean and std must be given together")
        if self.mean is not None and self.std is not None:
            if len(self.mean) == 0 or len(self.mean) != len(self.std):
                raise ConfigError(
                    f"mean and std need one value per channel, got {len(self.mean)} and "
                    f"{len(self.std)} values"
                )
            if any(s == 0 for s in self.std):
                raise ConfigError(f"std must not contain 0, got {self.std}")
        if not self.dtype.is_floating_point:
            raise ConfigError(f"dtype must be a floating point dtype, got {self.dtype}")

    @classmethod
    def build(
        cls,
        *,
        mean: Sequence[float] | None,
        std: Sequence[float] | None,
        dtype: torch.dtype,
        channels_last: bool,
        normalize_key: Hashable | Sequence[Hashable] | None,
    ) -> ImageTransform:
        """Build from user-facing arguments: ``normalize_key`` is one key, several, or None."""
        if normalize_key is None:
            keys: tuple[Hashable, ...] = ()
        elif isinstance(normalize_key, Sequence) and not isinstance(normalize_key, (str, bytes)):
            keys = tuple(normalize_key)
        else:
            keys = (normalize_key,)
        return cls(
            mean=None if mean is None else tuple(float(m) for m in mean),
            std=None if std is None else tuple(float(s) for s in std),
            dtype=dtype,
            channels_last=channels_last,
            keys=keys,
        )

    def selects(self, path: Path, leaf: object) -> bool:
        """Whether ``leaf`` at ``path`` is the image this transform converts."""
        if not self.keys:
            return False
        # bool is an int: key True must not match position 1, nor False position 0
        at_key = path == () or (
            len(path) == 1 and any(k == path[0] and type(k) is type(path[0]) for k in self.keys)
        )
        if not at_key or not isinstance(leaf, torch.Tensor):
            return False
        if leaf.dtype != torch.uint8 or leaf.ndim not in (3, 4):
            return False
        return self.mean is None or leaf.shape[-3] == len(self.mean)


class DeviceImageTransform:
    """An :class:`ImageTransform` bound to a device: ``(x / 255 - mean) / std`` computed as
    ``x * scale + shift`` in place (keeping the memory format), ``scale = 1 / (255 * std)``,
    ``shift = -mean / std``."""

    def __init__(self, spec: ImageTransform, device: torch.device) -> None:
        self.spec = spec
        self._compute_dtype = torch.float64 if spec.dtype == torch.float64 else torch.float32
        self._affine: tuple[torch.Tensor, torch.Tensor] | None = None
        if spec.mean is not None and spec.std is not None:
            mean = torch.tensor(spec.mean, dtype=torch.float64)
            std = torch.tensor(spec.std, dtype=torch.float64)
            shape = (len(spec.mean), 1, 1)
            scale = (1.0 / (255.0 * std)).to(self._compute_dtype).reshape(shape)
            shift = (-mean / std).to(self._compute_dtype).reshape(shape)
            self._affine = (scale.to(device), shift.to(device))

    def __call__(self, image: torch.Tensor) -> torch.Tensor:
        layout = (
            torch.channels_last
            if self.spec.channels_last and image.ndim == 4
            else torch.contiguous_format
        )
        if self._affine is None:
            return image.contiguous(memory_format=layout)
        scale, shift = self._affine
        out = image.to(dtype=self._compute_dtype, memory_format=layout)
        out.mul_(scale).add_(shift)
        return out if out.dtype == self.spec.dtype else out.to(self.spec.dtype)
