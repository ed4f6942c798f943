from __future__ import annotations

from typing import Any

import pytest
import torch

from concurrent_loader.errors import ConfigError
from concurrent_loader.gpu.normalize import DeviceImageTransform, ImageTransform

MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)


def reference(x: torch.Tensor) -> torch.Tensor:
    mean = torch.tensor(MEAN, dtype=torch.float64).view(3, 1, 1)
    std = torch.tensor(STD, dtype=torch.float64).view(3, 1, 1)
    return (x.double() / 255 - mean) / std


def images(*shape: int) -> torch.Tensor:
    return torch.randint(
        0, 256, shape, dtype=torch.uint8, generator=torch.Generator().manual_seed(0)
    )


@pytest.mark.parametrize(
    "kwargs",
    [
        {"mean": MEAN},
        {"std": STD},
        {"mean": (0.5, 0.5), "std": STD},
        {"mean": (), "std": ()},
        {"mean": MEAN, "std": (0.2, 0.0, 0.2)},
        {"mean": MEAN, "std": STD, "dtype": torch.int32},
    ],
)
def test_invalid_arguments_raise_config_error(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ConfigError):
        ImageTransform(**kwargs)


def test_build_accepts_one_key_several_or_none() -> None:
    def build(key: Any) -> ImageTransform:
        return ImageTransform.build(
            mean=MEAN, std=STD, dtype=torch.float32, channels_last=False, normalize_key=key
        )

    assert build("img").keys == ("img",)
    assert build(2).keys == (2,)
    assert build(["a", 1]).keys == ("a", 1)
    assert build(None).keys == ()


def test_default_keys_select_first_element_or_image_key() -> None:
    t = ImageTransform(mean=MEAN, std=STD)
    img = images(2, 3, 4, 4)
    assert t.selects((), img)
    assert t.selects((0,), img)
    assert t.selects(("image",), img)
    assert t.selects(("images",), img)
    assert not t.selects((1,), img)
    assert not t.selects(("mask",), img)
    assert not t.selects((0, "image"), img)  # only the top level
    assert not t.selects((False,), img)  # a bool key is not position 0


@pytest.mark.parametrize(
    "leaf",
    [
        torch.zeros(2, 3, 4, 4),  # not uint8
        images(2, 4, 4, 4),  # 4 channels, mean has 3
        images(3, 4),  # 2-D
        images(1, 2, 3, 4, 4),  # 5-D
        "not a tensor",
    ],
)
def test_only_uint8_images_with_matching_channels_are_selected(leaf: Any) -> None:
    assert not ImageTransform(mean=MEAN, std=STD).selects((0,), leaf)


def test_without_mean_any_channel_count_is_an_image() -> None:
    assert ImageTransform(channels_last=True).selects((0,), images(2, 4, 4, 4))


def test_normalisation_matches_reference() -> None:
    x = images(2, 3, 5, 7)
    out = DeviceImageTransform(ImageTransform(mean=MEAN, std=STD), torch.device("cpu"))(x)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out.double(), reference(x), rtol=0, atol=1e-5)


def test_single_chw_image() -> None:
    x = images(3, 5, 7)
    out = DeviceImageTransform(
        ImageTransform(mean=MEAN, std=STD, channels_last=True), torch.device("cpu")
    )(x)
    assert out.is_contiguous()
    torch.testing.assert_close(out.double(), reference(x), rtol=0, atol=1e-5)


def test_channels_last_and_low_precision() -> None:
    x = images(2, 3, 5, 7)
    convert = ImageTransform(mean=MEAN, std=STD, dtype=torch.bfloat16, channels_last=True)
    out = DeviceImageTransform(convert, torch.device("cpu"))(x)
    assert out.dtype == torch.bfloat16
    assert out.is_contiguous(memory_format=torch.channels_last)
    torch.testing.assert_close(out.double(), reference(x), rtol=1e-2, atol=2e-2)


def test_float64_is_computed_in_float64() -> None:
    x = images(1, 3, 4, 4)
    out = DeviceImageTransform(
        ImageTransform(mean=MEAN, std=STD, dtype=torch.float64), torch.device("cpu")
    )(x)
    assert out.dtype == torch.float64
    torch.testing.assert_close(out, reference(x), rtol=0, atol=1e-12)


def test_without_mean_values_are_kept_and_layout_changes() -> None:
    x = images(2, 3, 5, 7)
    out = DeviceImageTransform(ImageTransform(channels_last=True), torch.device("cpu"))(x)
    assert out.dtype == torch.uint8
    assert out.is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(out, x)
