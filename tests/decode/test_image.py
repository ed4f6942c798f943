import io

import numpy as np
import pytest
import torch
from PIL import Image

from concurrent_loader.decode import ImageDecoder, center_crop_box
from concurrent_loader.errors import DecodeError


def _jpeg(w: int, h: int, seed: int = 0) -> bytes:
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:h, 0:w]
    base = np.stack([xx * 255 // w, yy * 255 // h, (xx + yy) * 255 // (w + h)], -1)
    noise = rng.integers(0, 30, (h, w, 3))
    buf = io.BytesIO()
    Image.fromarray(np.clip(base + noise, 0, 255).astype(np.uint8)).save(buf, "JPEG", quality=92)
    return buf.getvalue()


def test_center_crop_box_matches_resize_then_crop_geometry():
    left, top, right, bottom = center_crop_box(500, 375, 224, 224)
    assert (right - left, bottom - top) == pytest.approx((375, 375))
    assert left == pytest.approx(62.5) and top == pytest.approx(0, abs=1e-9)


@pytest.mark.parametrize("size", [(224, 224), (100, 180), (64, 64)])
def test_fused_decode_is_close_to_full_decode_resize_crop(size):
    data = _jpeg(500, 375)
    out = ImageDecoder(size)(data)
    assert out.shape == (3, *size) and out.dtype == torch.uint8
    image = Image.open(io.BytesIO(data)).convert("RGB")
    box = center_crop_box(image.width, image.height, *size)
    reference = np.asarray(image.resize((size[1], size[0]), Image.Resampling.BILINEAR, box=box))
    diff = np.abs(out.permute(1, 2, 0).numpy().astype(int) - reference.astype(int))
    assert diff.mean() < 4  # draft mode decodes at a DCT scale: close, not bit-identical


def test_draft_mode_is_used_when_the_target_is_much_smaller():
    data = _jpeg(800, 600)
    drafted, full = ImageDecoder(64)(data), ImageDecoder(64, draft=False)(data)
    assert drafted.shape == full.shape == (3, 64, 64)
    # A DCT-scaled decode gives (slightly) different pixels than a full decode + resize.
    assert not torch.equal(drafted, full)
    # ...but not when the target is too big for any reduced scale (224 of 300 px).
    small = _jpeg(300, 225)
    assert torch.equal(ImageDecoder(224)(small), ImageDecoder(224, draft=False)(small))


def test_transform_gets_a_pil_image():
    seen = []
    decoder = ImageDecoder(32, transform=lambda im: seen.append(im.size) or "ok")
    assert decoder(_jpeg(100, 80)) == "ok" and seen == [(32, 32)]


@pytest.mark.parametrize("data,cause", [(b"", "EmptyObject"), (b"not an image", None)])
def test_bad_bytes_raise_decode_error_naming_the_object(data, cause):
    with pytest.raises(DecodeError) as info:
        ImageDecoder(32)(data, "s3://b/k.jpg")
    assert info.value.url == "s3://b/k.jpg" and "s3://b/k.jpg" in str(info.value)
    if cause:
        assert info.value.cause == cause


def test_truncated_jpeg_raises_decode_error():
    data = _jpeg(200, 150)
    with pytest.raises(DecodeError, match="s3://b/t.jpg"):
        ImageDecoder(32)(data[: len(data) // 2], "s3://b/t.jpg")


def test_a_decompression_bomb_is_a_decode_error_naming_the_object(monkeypatch):
    image = Image.new("RGB", (64, 64))
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    # Pillow refuses images over twice MAX_IMAGE_PIXELS outright (DecompressionBombError).
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 64 * 64 // 4)
    with pytest.raises(DecodeError) as caught:
        ImageDecoder(32)(buffer.getvalue(), "s3://bucket/bomb.png")
    error = caught.value
    assert (error.url, error.stage, error.cause) == (
        "s3://bucket/bomb.png",
        "decode",
        "DecompressionBomb",
    )
    assert isinstance(error.__cause__, Image.DecompressionBombError)
    assert "s3://bucket/bomb.png" in str(error)
