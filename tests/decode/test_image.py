import io

import numpy as np
import pytest
import torch
from PIL import Image, JpegImagePlugin

from concurrent_loader.decode import ImageDecoder, center_crop_box
from concurrent_loader.decode.presize import write_raw
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


# ------------------------------------------------- resize_size: Resize(R) + CenterCrop(S)


def _torchvision_resize_center_crop(
    image: Image.Image, resize_size: int, crop: tuple[int, int]
) -> np.ndarray:
    """torchvision's ``Resize(resize_size)`` then ``CenterCrop(crop)`` on a PIL image, as
    torchvision computes them (``_compute_resized_output_size``: the longer side truncated;
    ``center_crop``: ``int(round((size - crop) / 2.0))``), with PIL's bilinear resize."""
    w, h = image.size
    if w <= h:
        new_w, new_h = resize_size, int(resize_size * h / w)
    else:
        new_w, new_h = int(resize_size * w / h), resize_size
    if (new_w, new_h) != (w, h):
        image = image.resize((new_w, new_h), Image.Resampling.BILINEAR)
    crop_h, crop_w = crop
    top, left = round((new_h - crop_h) / 2.0), round((new_w - crop_w) / 2.0)
    return np.array(image.crop((left, top, left + crop_w, top + crop_h)))


def _noise(w: int, h: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)


def _as_jpeg(pixels: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, "JPEG", quality=90)
    return buf.getvalue()


@pytest.mark.parametrize(
    ("width", "height"),
    # landscape, portrait, odd sides, a longer side truncated (500 * 256 / 375 = 341.3),
    # crop offsets of x.5 (rounded half to even, as torchvision's round does), square, and
    # tall portraits (for which Pillow resizes vertically first)
    [
        (500, 375),
        (375, 500),
        (333, 257),
        (601, 401),
        (299, 256),
        (257, 257),
        (255, 300),
        (300, 700),
        (375, 800),
        (260, 1999),
    ],
)
@pytest.mark.parametrize(("crop", "resize_size"), [((224, 224), 256), ((200, 180), 232)])
def test_resize_size_equals_torchvision_resize_then_center_crop(width, height, crop, resize_size):
    pixels = _noise(width, height)
    raw = write_raw(pixels)
    jpeg = _as_jpeg(pixels)
    reference = _torchvision_resize_center_crop(Image.fromarray(pixels), resize_size, crop)
    from_jpeg = _torchvision_resize_center_crop(
        Image.open(io.BytesIO(jpeg)).convert("RGB"), resize_size, crop
    )
    decoder = ImageDecoder(crop, resize_size=resize_size)
    # No draft at these sizes (no 1/2 scale covers the resize): pixel for pixel.
    for data, expected in ((raw, reference), (jpeg, from_jpeg)):
        out = decoder(data)
        assert out.shape == (3, *crop) and out.dtype == torch.uint8
        assert torch.equal(out.permute(1, 2, 0), torch.from_numpy(expected))
        assert np.array_equal(np.asarray(decoder.open(data)), expected)


@pytest.mark.parametrize(("width", "height"), [(341, 256), (256, 384), (256, 256), (301, 256)])
def test_an_image_stored_at_resize_size_is_only_cropped(monkeypatch, width, height):
    pixels = _noise(width, height, seed=4)
    jpeg = _as_jpeg(pixels)
    expected_raw = _torchvision_resize_center_crop(Image.fromarray(pixels), 256, (224, 224))
    expected_jpeg = _torchvision_resize_center_crop(
        Image.open(io.BytesIO(jpeg)).convert("RGB"), 256, (224, 224)
    )

    def no_resample(*args, **kwargs):
        raise AssertionError("resampled an image that needs only a crop")

    monkeypatch.setattr(Image.Image, "resize", no_resample)
    decoder = ImageDecoder(224, resize_size=256)
    assert torch.equal(decoder(write_raw(pixels)).permute(1, 2, 0), torch.from_numpy(expected_raw))
    assert torch.equal(decoder(jpeg).permute(1, 2, 0), torch.from_numpy(expected_jpeg))


def test_resize_size_drafts_to_the_largest_scale_not_below_the_resize(monkeypatch):
    seen = []
    draft = JpegImagePlugin.JpegImageFile.draft

    def recording(self, mode, size):
        result = draft(self, mode, size)
        seen.append((size, self.size))
        return result

    monkeypatch.setattr(JpegImagePlugin.JpegImageFile, "draft", recording)
    data = _jpeg(1200, 900)
    out = ImageDecoder(224, resize_size=256)(data)
    # 1200x900 resized to 341x256: 1/2 scale (600x450) covers it, 1/4 (300x225) would not.
    assert seen == [((341, 256), (600, 450))]
    reference = _torchvision_resize_center_crop(
        Image.open(io.BytesIO(data)).convert("RGB"), 256, (224, 224)
    )
    diff = np.abs(out.permute(1, 2, 0).numpy().astype(int) - reference.astype(int))
    assert diff.mean() < 4  # draft mode decodes at a DCT scale: close, not bit-identical
    full = ImageDecoder(224, resize_size=256, draft=False)(data)
    assert torch.equal(full.permute(1, 2, 0), torch.from_numpy(reference))


def test_without_resize_size_the_geometry_is_the_cover_box_as_before():
    pixels = _noise(500, 375, seed=5)
    out = ImageDecoder(224)(write_raw(pixels))
    image = Image.fromarray(pixels)
    box = center_crop_box(500, 375, 224, 224)
    expected = np.array(image.resize((224, 224), Image.Resampling.BILINEAR, box=box))
    assert torch.equal(out.permute(1, 2, 0), torch.from_numpy(expected))


def test_a_transform_gets_the_resized_and_cropped_image():
    seen = []
    decoder = ImageDecoder(224, resize_size=256, transform=lambda im: seen.append(im.size))
    decoder(write_raw(_noise(341, 256)))
    decoder(_as_jpeg(_noise(500, 375)))
    assert seen == [(224, 224), (224, 224)]


@pytest.mark.parametrize(
    ("image_size", "resize_size", "message"),
    [
        (224, 200, "smaller than the crop"),
        ((100, 240), 232, "smaller than the crop"),
        (None, 256, "needs image_size"),
        (224, True, "must be an int"),
        (224, 256.0, "must be an int"),
    ],
)
def test_resize_size_that_cannot_work_is_refused(image_size, resize_size, message):
    with pytest.raises(ValueError, match=message):
        ImageDecoder(image_size, resize_size=resize_size)


# ------------------------------------------------- simplejpeg: the same pixels as Pillow's


def _jpeg_variants() -> dict[str, bytes]:
    pixels = _noise(341, 256, seed=7)
    out = {}
    for name, mode, options in [
        ("4:2:0", "RGB", {"subsampling": "4:2:0"}),
        ("4:2:2", "RGB", {"subsampling": "4:2:2"}),
        ("4:4:4", "RGB", {"subsampling": "4:4:4"}),
        ("progressive", "RGB", {"progressive": True}),
        ("greyscale", "L", {}),
        ("cmyk", "CMYK", {}),
    ]:
        buf = io.BytesIO()
        Image.fromarray(pixels).convert(mode).save(buf, "JPEG", quality=85, **options)
        out[name] = buf.getvalue()
    buf = io.BytesIO()
    Image.fromarray(_noise(333, 257, seed=8)).save(buf, "JPEG", quality=95)
    out["odd sides"] = buf.getvalue()
    return out


@pytest.mark.parametrize("variant", list(_jpeg_variants()))
@pytest.mark.parametrize(
    "kwargs", [{}, {"image_size": 224, "resize_size": 256}, {"image_size": 200}]
)
def test_simplejpeg_gives_pillows_pixels(monkeypatch, variant, kwargs):
    from concurrent_loader.decode import image as image_module

    simplejpeg = pytest.importorskip("simplejpeg")
    data = _jpeg_variants()[variant]
    calls, decode = [], simplejpeg.decode_jpeg

    def counting(*args, **options):
        calls.append(options)
        return decode(*args, **options)

    decoder = ImageDecoder(**kwargs)
    monkeypatch.setattr(image_module, "simplejpeg", None)
    expected = decoder(data)
    monkeypatch.setattr(image_module, "simplejpeg", simplejpeg)
    monkeypatch.setattr(simplejpeg, "decode_jpeg", counting)
    assert torch.equal(decoder(memoryview(data)), expected)
    # CMYK goes to Pillow (its CMYK-to-RGB differs from libjpeg-turbo's), and so does an
    # image to resize (200 of 341x256; 333x257 to 256); the rest is only cropped, or whole.
    size = Image.open(io.BytesIO(data)).size
    crop_only = decoder.image_size is None or decoder.geometry(*size)[1] is not None
    assert len(calls) == (1 if variant != "cmyk" and crop_only else 0)
    assert crop_only == (kwargs == {} or ("resize_size" in kwargs and variant != "odd sides"))


@pytest.mark.parametrize("kwargs", [{"image_size": 224, "resize_size": 256}, {}])
def test_a_truncated_jpeg_that_needs_only_a_crop_is_a_decode_error(kwargs):
    data = _as_jpeg(_noise(341, 256, seed=9))  # stored at the resize: a crop, no resample
    with pytest.raises(DecodeError, match="s3://b/t.jpg") as info:
        ImageDecoder(**kwargs)(data[: len(data) // 2], "s3://b/t.jpg")
    assert info.value.cause == "Undecodable"
