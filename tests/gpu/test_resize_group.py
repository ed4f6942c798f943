"""Resizing images of one shape together gives exactly what resizing each alone gives."""

from __future__ import annotations

import torch

from concurrent_loader.gpu import resize_crop


def test_a_group_resize_equals_one_by_one() -> None:
    generator = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (5, 3, 75, 100), dtype=torch.uint8, generator=generator)
    together = resize_crop(images, (32, 32))
    assert together.shape == (5, 3, 32, 32) and together.dtype == torch.uint8
    for image, crop in zip(images, together, strict=True):
        assert torch.equal(resize_crop(image, (32, 32)), crop)
