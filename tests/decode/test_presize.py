"""Presize: images stored at a smaller short side (a JPEG or raw pixels), and the decoders
reading them."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from PIL import Image

from concurrent_loader.decode import (
    EncodedImageDecoder,
    ImageDecoder,
    PILBatchDecoder,
    Presize,
    is_raw,
    read_raw,
)
from concurrent_loader.decode.image import to_tensor
from concurrent_loader.decode.presize import RAW_HEADER_SIZE, write_raw
from concurrent_loader.errors import ConfigError, DecodeError

URL = "s3://bucket/train/c/x.jpg"


def _pixels(w: int, h: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:h, 0:w]
    base = np.stack([xx * 255 // w, yy * 255 // h, (xx + yy) * 255 // (w + h)], -1)
    return np.clip(base + rng.integers(0, 20, (h, w, 3)), 0, 255).astype(np.uint8)


def _encode(image: Image.Image, fmt: str = "JPEG", **options: object) -> bytes:
    buf = io.BytesIO()
    image.save(buf, fmt, **options)
    return buf.getvalue()


def _jpeg(w: int, h: int, seed: int = 0) -> bytes:
    return _encode(Image.fromarray(_pixels(w, h, seed)), quality=92)


def _decoded(data: bytes) -> Image.Image:
    if is_raw(data):
        return Image.fromarray(read_raw(data))
    image = Image.open(io.BytesIO(data))
    image.load()
    return image


# ------------------------------------------------------------------------- the setting


@pytest.mark.parametrize(
    "args",
    [(0,), (-1,), (True,), (256.0,), ("256",), (256, "png"), (256, "jpeg", 0), (256, "jpeg", 101)],
)
def test_bad_settings_are_refused_with_a_config_error(args):
    with pytest.raises(ConfigError) as info:
        Presize(*args)
    assert "Presize." in str(info.value)
    assert isinstance(info.value, ValueError)


def test_identity_names_the_setting():
    assert Presize(256).identity == "presize-v1:jpeg:256:q90"
    assert Presize(160, "jpeg", 75).identity == "presize-v1:jpeg:160:q75"
    assert Presize(256, "raw").identity == Presize(256, "raw", 50).identity == "presize-v2:raw:256"
    assert Presize(256) == Presize(256, "jpeg", 90) and hash(Presize(256)) == hash(Presize(256))


# -------------------------------------------------------------------- geometry and bytes


@pytest.mark.parametrize("fmt", ["jpeg", "raw"])
def test_the_same_input_gives_the_same_bytes(fmt):
    data = _jpeg(500, 375)
    presize = Presize(256, fmt)
    assert presize.apply(data) == presize.apply(bytearray(data)) == presize.apply(memoryview(data))


@pytest.mark.parametrize(
    "size,expected",
    [((500, 375), (341, 256)), ((375, 500), (256, 341)), ((1000, 256), (1000, 256))],
)
def test_the_short_side_is_the_target_and_the_aspect_is_kept(size, expected):
    for fmt in ("jpeg", "raw"):
        out = Presize(256, fmt).apply(_jpeg(*size))
        assert _decoded(out).size == expected


@pytest.mark.parametrize("size", [(200, 150), (100, 300), (256, 256)])
def test_images_are_never_upscaled(size):
    for fmt in ("jpeg", "raw"):
        out, original = Presize(256, fmt).apply_sized(_jpeg(*size))
        assert _decoded(out).size == size and original == size


def test_the_jpeg_form_has_no_metadata_and_is_rgb_baseline():
    image = Image.fromarray(_pixels(400, 300))
    exif = image.getexif()
    exif[0x010F] = "camera"
    data = _encode(image, exif=exif.tobytes(), dpi=(300, 300), comment=b"x")
    out = Image.open(io.BytesIO(Presize(128).apply(data)))
    assert out.format == "JPEG" and out.mode == "RGB"
    assert not out.getexif() and "dpi" not in out.info and "comment" not in out.info
    assert not out.info.get("progressive")


def test_the_pixels_are_close_to_a_full_resize():
    pixels = _pixels(800, 600)
    reference = np.asarray(Image.fromarray(pixels).resize((341, 256), Image.Resampling.LANCZOS))
    raw = read_raw(Presize(256, "raw").apply(_encode(Image.fromarray(pixels), "PNG")))
    assert np.abs(raw.astype(int) - reference).mean() < 1  # PNG in: only the drafting differs
    jpeg = np.asarray(_decoded(Presize(256).apply(_jpeg(800, 600))))
    assert np.abs(jpeg.astype(int) - reference).mean() < 4


# ------------------------------------------------------------------ orientation and modes


@pytest.mark.parametrize("orientation", [3, 6, 8])
def test_exif_orientation_is_applied(orientation):
    upright = np.zeros((40, 60, 3), np.uint8)
    upright[:, :] = (0, 0, 255)
    upright[:16, :16] = (255, 0, 0)  # a red block at the top left, as displayed
    undo = {
        3: Image.Transpose.ROTATE_180,
        6: Image.Transpose.ROTATE_90,
        8: Image.Transpose.ROTATE_270,
    }
    stored = Image.fromarray(upright).transpose(undo[orientation])
    exif = Image.Exif()
    exif[0x0112] = orientation
    data = _encode(stored, quality=95, exif=exif.tobytes())
    for fmt in ("jpeg", "raw"):
        out, original = Presize(256, fmt).apply_sized(data, URL)
        pixels = np.asarray(_decoded(out)).astype(int)
        assert pixels.shape == (40, 60, 3) and original == (60, 40)
        assert np.abs(pixels[2:14, 2:14] - (255, 0, 0)).max() < 40
        assert np.abs(pixels[25:38, 30:58] - (0, 0, 255)).max() < 40
    assert not Image.open(io.BytesIO(Presize(256).apply(data))).getexif()


def _modes() -> list[tuple[str, bytes, tuple[int, int, int]]]:
    rgba = Image.new("RGBA", (64, 48), (10, 200, 30, 0))  # fully transparent
    palette = Image.new("P", (64, 48), 1)
    palette.putpalette([0, 0, 0, 200, 100, 50] + [0] * 762)
    palette.info["transparency"] = 1
    gray16 = Image.fromarray(np.full((48, 64), 40000, np.uint16))
    cmyk = Image.new("RGB", (64, 48), (200, 100, 50)).convert("CMYK")
    return [
        ("RGBA", _encode(rgba, "PNG"), (10, 200, 30)),
        ("P", _encode(palette, "PNG"), (200, 100, 50)),
        ("I;16", _encode(gray16, "PNG"), (156, 156, 156)),  # 40000 / 257
        ("CMYK", _encode(cmyk, quality=95), (200, 100, 50)),
        ("L", _encode(Image.new("L", (64, 48), 77), "PNG"), (77, 77, 77)),
        ("LA", _encode(Image.new("LA", (64, 48), (77, 0)), "PNG"), (77, 77, 77)),
        ("1", _encode(Image.new("1", (64, 48), 1), "PNG"), (255, 255, 255)),
    ]


@pytest.mark.parametrize("mode,data,rgb", _modes(), ids=[m[0] for m in _modes()])
def test_every_mode_becomes_rgb_with_alpha_dropped(mode, data, rgb):
    assert Image.open(io.BytesIO(data)).mode.startswith(mode)
    for fmt in ("jpeg", "raw"):
        out = np.asarray(_decoded(Presize(32, fmt).apply(data, URL))).astype(int)
        assert out.shape == (32, 43, 3)
        tolerance = 0 if fmt == "raw" and mode not in ("CMYK",) else 3
        assert np.abs(out - rgb).max() <= tolerance, (fmt, out[0, 0])


def test_sixteen_bit_is_scaled_not_clipped():
    ramp = (np.arange(64, dtype=np.uint32) * 1040).astype(np.uint16)[None, :].repeat(48, 0)
    out = read_raw(Presize(48, "raw").apply(_encode(Image.fromarray(ramp), "PNG")))
    assert out[0, :, 0].tolist() == [round(v / 257) for v in ramp[0].tolist()]


# ------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    "data,cause",
    [
        (b"", "EmptyObject"),
        (b"this is not an image at all", "Undecodable"),
        (_jpeg(300, 200)[:2000], "Undecodable"),  # truncated
        (write_raw(np.zeros((4, 4, 3), np.uint8))[:-1], "Undecodable"),  # a short raw form
    ],
    ids=["empty", "not-an-image", "truncated-jpeg", "truncated-raw"],
)
@pytest.mark.parametrize("fmt", ["jpeg", "raw"])
def test_what_is_not_an_image_is_a_decode_error_naming_it(data, cause, fmt):
    with pytest.raises(DecodeError) as info:
        Presize(64, fmt).apply(data, URL)
    assert info.value.url == URL and info.value.cause == cause
    assert URL in str(info.value)


# --------------------------------------------------------------------------- raw form


def test_raw_round_trip_and_header():
    pixels = _pixels(37, 23)
    data = write_raw(pixels)
    assert is_raw(data) and len(data) == RAW_HEADER_SIZE + 23 * 37 * 3
    assert data[:4] == b"CLRW" and data[4] == 2 and data[5] == 3
    assert (
        int.from_bytes(data[8:12], "little") == 23 and int.from_bytes(data[12:16], "little") == 37
    )
    view = read_raw(data)
    assert view.shape == (23, 37, 3) and view.dtype == np.uint8
    assert np.array_equal(view, pixels)
    assert np.array_equal(read_raw(Presize(256, "raw").apply(data)), pixels)  # raw in, raw out
    assert not is_raw(_jpeg(10, 10)) and not is_raw(b"CLR")


@pytest.mark.parametrize(
    "mangle",
    [
        lambda d: d[:10],
        lambda d: d + b"\0",
        lambda d: d[:4] + b"\x03" + d[5:],  # version
        lambda d: d[:5] + b"\x02" + d[6:],  # channels
        lambda d: d[:8] + b"\0\0\0\0" + d[12:],  # height 0
    ],
)
def test_a_malformed_raw_form_is_a_decode_error(mangle):
    data = mangle(write_raw(_pixels(8, 6)))
    with pytest.raises(DecodeError) as info:
        read_raw(data, URL)
    assert info.value.url == URL and "malformed raw image" in str(info.value)
    with pytest.raises(DecodeError):
        ImageDecoder(4)(data, URL)


# ------------------------------------------------------------------ the decoders read it


@pytest.mark.parametrize("size", [224, (100, 180), 64])
def test_fused_decode_of_raw_equals_the_same_pixels_as_png(size):
    pixels = _pixels(341, 256, seed=3)
    raw, png = write_raw(pixels), _encode(Image.fromarray(pixels), "PNG")
    from_raw, from_png = ImageDecoder(size)(raw, URL), ImageDecoder(size)(png, URL)
    assert from_raw.shape == from_png.shape and from_raw.dtype == torch.uint8
    assert (from_raw.int() - from_png.int()).abs().max() <= 1


def test_fused_decode_of_a_presized_jpeg_is_close_to_that_of_the_original():
    original = _jpeg(500, 375)
    for fmt in ("jpeg", "raw"):
        presized = Presize(256, fmt).apply(original)
        ours, theirs = ImageDecoder(224)(presized), ImageDecoder(224)(original)
        assert ours.shape == theirs.shape == (3, 224, 224)
        assert (ours.float() - theirs.float()).abs().mean() < 4


def test_raw_without_a_size_is_the_array_and_a_transform_gets_a_pil_image():
    pixels = _pixels(30, 20)
    raw = write_raw(pixels)
    tensor = ImageDecoder()(raw)
    assert torch.equal(tensor, torch.from_numpy(pixels).permute(2, 0, 1))
    assert tensor.is_contiguous() and tensor.numpy().flags.writeable
    seen: list[tuple[str, tuple[int, int]]] = []
    assert ImageDecoder(transform=lambda im: seen.append((im.mode, im.size)) or "ok")(raw) == "ok"
    assert ImageDecoder(16, transform=lambda im: seen.append((im.mode, im.size)))(raw) is None
    assert seen == [("RGB", (30, 20)), ("RGB", (16, 16))]
    gray = ImageDecoder(mode="L")(raw)
    assert gray.shape == (1, 20, 30)
    assert ImageDecoder()(write_raw(pixels[:, :, 0])).shape == (3, 20, 30)


def test_the_encoded_path_ships_raw_and_its_batch_decoder_reads_it():
    raw = Presize(40, "raw").apply(_jpeg(80, 60))
    shipped = EncodedImageDecoder(32, "cpu")(raw, URL)
    assert bytes(shipped) == raw and shipped.size == (32, 32)
    [full] = PILBatchDecoder().decode([shipped.tensor()], torch.device("cpu"))
    assert torch.equal(full, torch.from_numpy(read_raw(raw).copy()).permute(2, 0, 1))
    with pytest.raises(DecodeError):
        EncodedImageDecoder(32, "cpu")(raw[:-3], URL)


@pytest.mark.parametrize(
    ("shape", "offset"), [((224, 298), (0, 37)), ((299, 224), (38, 0)), ((224, 224), (0, 0))]
)
def test_raw_at_the_output_size_is_only_cropped(shape, offset):
    rng = np.random.default_rng(1)
    pixels = rng.integers(0, 256, (*shape, 3), dtype=np.uint8)
    out = ImageDecoder(224)(write_raw(pixels))
    top, left = offset  # torchvision's CenterCrop rounding: round(37.5) == 38
    expected = torch.from_numpy(
        pixels[top : top + 224, left : left + 224].transpose(2, 0, 1).copy()
    )
    assert torch.equal(out, expected)


def test_raw_at_the_output_size_with_whole_offsets_equals_the_resize_path():
    pixels = np.random.default_rng(2).integers(0, 256, (224, 298, 3), dtype=np.uint8)
    raw = write_raw(pixels)
    assert torch.equal(ImageDecoder(224)(raw), to_tensor(ImageDecoder(224).open(raw)))


def test_raw_larger_than_the_output_is_resized():
    pixels = np.random.default_rng(3).integers(0, 256, (256, 341, 3), dtype=np.uint8)
    raw = write_raw(pixels)
    assert torch.equal(ImageDecoder(224)(raw), to_tensor(ImageDecoder(224).open(raw)))
