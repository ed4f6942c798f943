"""EncodedImage and the worker-side decoder of ``decode_on``: bytes shipped, header checked."""

from __future__ import annotations

import io
import pickle

import numpy as np
import pytest
import torch
from PIL import Image
from torch.utils.data import default_collate

from concurrent_loader import ImageFolder, ImageSample
from concurrent_loader.decode import (
    EncodedImage,
    EncodedImageDecoder,
    ImageDecoder,
    PILBatchDecoder,
    check_decode_on,
    image_decoder,
)
from concurrent_loader.errors import ConfigError, DecodeError, Reason


def _jpeg(w: int, h: int, color: tuple[int, int, int] = (200, 30, 90)) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(np.full((h, w, 3), color, np.uint8)).save(buf, "JPEG", quality=95)
    return buf.getvalue()


def test_encoded_image_is_its_bytes_with_attributes():
    data = _jpeg(40, 30)
    image = EncodedImage(data, (16, 24), "s3://b/k.jpg", "cpu")
    assert image == data and isinstance(image, bytes)
    assert (image.size, image.url, image.decode_on) == ((16, 24), "s3://b/k.jpg", "cpu")
    assert "s3://b/k.jpg" in str(image) and len(str(image)) < 200  # not every byte
    assert torch.equal(image.tensor(), torch.tensor(list(data), dtype=torch.uint8))


@pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
def test_encoded_image_keeps_its_attributes_through_pickle(protocol):
    image = EncodedImage(_jpeg(40, 30), (16, 24), "s3://b/k.jpg", "cuda")
    back = pickle.loads(pickle.dumps(image, protocol=protocol))
    assert type(back) is EncodedImage and back == image
    assert (back.size, back.url, back.decode_on) == ((16, 24), "s3://b/k.jpg", "cuda")


def test_default_collate_keeps_a_batch_of_encoded_images_as_a_list():
    items = [(EncodedImage(_jpeg(8, 8), (4, 4), f"k{i}"), i) for i in range(3)]
    images, labels = default_collate(items)
    assert [im.url for im in images] == ["k0", "k1", "k2"]
    assert all(type(im) is EncodedImage for im in images)
    assert torch.equal(labels, torch.tensor([0, 1, 2]))


def test_the_worker_side_decoder_ships_the_bytes_untouched():
    data = _jpeg(40, 30)
    out = EncodedImageDecoder(16, "cpu")(data, "s3://b/k.jpg")
    assert out == data and out.size == (16, 16) and out.url == "s3://b/k.jpg"
    assert EncodedImageDecoder((10, 20))(bytearray(data)).size == (10, 20)


@pytest.mark.parametrize(
    "data,cause", [(b"", Reason.EMPTY_OBJECT), (b"not an image", Reason.UNDECODABLE)]
)
def test_what_is_not_an_image_fails_in_the_worker_naming_the_object(data, cause):
    with pytest.raises(DecodeError) as info:
        EncodedImageDecoder(16)(data, "s3://b/bad.jpg")
    assert info.value.url == "s3://b/bad.jpg" and info.value.cause == cause


def _noisy_jpeg(w: int, h: int) -> bytes:
    buf = io.BytesIO()
    pixels = np.random.default_rng(0).integers(0, 256, (h, w, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(buf, "JPEG", quality=90)
    return buf.getvalue()


def test_a_corrupt_body_behind_a_valid_header_is_left_to_the_batch_decode():
    data = _noisy_jpeg(256, 192)
    truncated = data[: len(data) // 2]
    assert EncodedImageDecoder(16)(truncated, "k") == truncated  # header only
    with pytest.raises(DecodeError):
        PILBatchDecoder().decode([EncodedImage(truncated, (16, 16)).tensor()], torch.device("cpu"))


@pytest.mark.parametrize(
    "decode_on,image_size,transform,message",
    [
        ("gpu", 16, None, "decode_on must be one of"),
        ("cuda", None, None, "needs image_size"),
        ("cpu", 16, lambda im: im, "cannot take a transform"),
    ],
)
def test_options_that_cannot_work_are_config_errors(decode_on, image_size, transform, message):
    with pytest.raises(ConfigError, match=message):
        check_decode_on(decode_on, image_size, transform)
    with pytest.raises(ConfigError, match=message):
        ImageSample(image_size, transform=transform, decode_on=decode_on)


def test_image_folder_with_decode_on_yields_encoded_images(tmp_path):
    (tmp_path / "cat").mkdir()
    (tmp_path / "cat" / "a.jpg").write_bytes(_jpeg(40, 30))
    ds = ImageFolder(tmp_path, image_size=16, decode_on="cuda")  # no CUDA needed here
    try:
        image, label = ds[0]
        assert type(image) is EncodedImage and label == 0
        assert image.size == (16, 16) and image.url is not None and image.url.endswith("a.jpg")
        back = pickle.loads(pickle.dumps(ds))
        assert isinstance(back.decoder, EncodedImageDecoder)
    finally:
        ds.close()
    with pytest.raises(ConfigError, match="needs image_size"):
        ImageFolder(tmp_path, decode_on="cpu")


def test_image_sample_with_decode_on_yields_encoded_images():
    sample = {"__key__": "0", "__url__": "s3://b/shard.tar#0", "jpg": _jpeg(40, 30), "cls": b"3"}
    image, label = ImageSample(16, decode_on="cpu")(sample)
    assert type(image) is EncodedImage and label == 3 and image.url == "s3://b/shard.tar#0"


def test_the_pil_stand_in_decodes_full_size_rgb():
    gray = io.BytesIO()
    Image.fromarray(np.full((30, 40), 77, np.uint8)).save(gray, "PNG")
    data = [
        torch.frombuffer(bytearray(b), dtype=torch.uint8) for b in (_jpeg(40, 30), gray.getvalue())
    ]
    out = PILBatchDecoder().decode(data, torch.device("cpu"))
    assert [t.shape for t in out] == [(3, 30, 40), (3, 30, 40)]
    assert all(t.dtype == torch.uint8 for t in out)
    assert torch.equal(out[1], torch.full((3, 30, 40), 77, dtype=torch.uint8))
    assert torch.equal(out[0], ImageDecoder(None)(_jpeg(40, 30)))


def test_resize_size_travels_with_the_encoded_image():
    out = EncodedImageDecoder(16, "cpu", resize_size=20)(_jpeg(40, 30), "s3://b/k.jpg")
    assert (out.size, out.resize_size) == ((16, 16), 20) and "resize_size=20" in repr(out)
    back = pickle.loads(pickle.dumps(out))
    assert (back.size, back.resize_size, back.url) == ((16, 16), 20, "s3://b/k.jpg")
    assert EncodedImageDecoder(16)(_jpeg(40, 30)).resize_size is None
    with pytest.raises(ValueError, match="smaller than the crop"):
        EncodedImageDecoder(16, "cpu", resize_size=12)


def test_image_decoder_builds_the_decoder_the_options_ask_for():
    plain = image_decoder(224, resize_size=256)
    assert type(plain) is ImageDecoder and plain.resize_size == 256
    encoded = image_decoder(224, decode_on="cuda", resize_size=256)
    assert type(encoded) is EncodedImageDecoder and encoded.resize_size == 256
    assert type(image_decoder()) is ImageDecoder and image_decoder().resize_size is None
    with pytest.raises(ConfigError, match="needs image_size"):
        image_decoder(decode_on="cpu")
    with pytest.raises(ValueError, match="needs image_size"):
        image_decoder(resize_size=256)


def test_image_folder_and_image_sample_pass_resize_size_to_their_decoder(tmp_path):
    data = _noisy_jpeg(60, 40)
    expected = ImageDecoder(32, resize_size=36, draft=False)(data)
    assert not torch.equal(expected, ImageDecoder(32, draft=False)(data))  # it matters
    (tmp_path / "cat").mkdir()
    (tmp_path / "cat" / "a.jpg").write_bytes(data)
    ds = ImageFolder(tmp_path, image_size=32, resize_size=36)
    try:
        assert torch.equal(ds[0][0], expected)
    finally:
        ds.close()
    sample = {"__key__": "0", "__url__": "s3://b/shard.tar#0", "jpg": data, "cls": b"1"}
    image, label = ImageSample(32, resize_size=36)(sample)
    assert torch.equal(image, expected) and label == 1
    encoded, _ = ImageSample(32, resize_size=36, decode_on="cpu")(sample)
    assert encoded.resize_size == 36
