"""Batch decoding of encoded images in the prefetcher, on the CPU (the Pillow stand-in).

The plumbing is the same for ``decode_on="cuda"`` (see test_decode_cuda.py on a GPU): the
transfer finds the list of EncodedImage, decodes it in one call, resizes and crops, and
hands the uint8 batch to the normalisation.
"""

from __future__ import annotations

import io
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

from concurrent_loader import ConcurrentDataLoader, ImageFolder
from concurrent_loader.decode import EncodedImage, ImageDecoder
from concurrent_loader.errors import ConfigError, DecodeError
from concurrent_loader.gpu import CUDAPrefetcher, EncodedBatchDecoder, resize_crop
from concurrent_loader.gpu.decode import TorchvisionDecoder, decode_images

MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)
CPU = torch.device("cpu")

pytestmark = pytest.mark.usefixtures("no_new_threads")


def noisy_jpeg(w: int, h: int, seed: int = 0) -> bytes:
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:h, 0:w]
    base = np.stack([xx * 255 // w, yy * 255 // h, (xx + yy) * 255 // (w + h)], -1)
    pixels = np.clip(base + rng.integers(0, 20, (h, w, 3)), 0, 255).astype(np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, "JPEG", quality=92)
    return buf.getvalue()


def solid(color: tuple[int, int, int], w: int = 48, h: int = 40, fmt: str = "JPEG") -> bytes:
    buf = io.BytesIO()
    Image.fromarray(np.full((h, w, 3), color, np.uint8)).save(buf, fmt, quality=98)
    return buf.getvalue()


def color_of(index: int) -> tuple[int, int, int]:
    """A distinct colour per image, far enough apart to survive JPEG."""
    return (20 + 40 * (index % 6), 20 + 40 * (index // 6 % 6), 200 - 30 * (index // 36))


def make_folder(root: Path, classes: int = 3, per_class: int = 5) -> dict[str, tuple[int, int]]:
    """``root/<class>/<i>.jpg`` of solid colours; file name -> (image number, class)."""
    made = {}
    n = 0
    for c in range(classes):
        (root / f"c{c}").mkdir(parents=True)
        for i in range(per_class):
            w, h = 40 + 7 * i, 30 + 5 * c  # sizes differ: the batch decode must not care
            (root / f"c{c}" / f"{i}.jpg").write_bytes(solid(color_of(n), w, h))
            made[f"c{c}/{i}.jpg"] = (n, c)
            n += 1
    return made


@pytest.mark.parametrize("size", [(224, 224), (100, 180), (64, 64), (300, 500)])
def test_resize_crop_matches_the_cpu_fused_decode(size):
    data = noisy_jpeg(500, 375)
    full = ImageDecoder(None)(data)
    out = resize_crop(full, size)
    assert out.shape == (3, *size) and out.dtype == torch.uint8
    fused = ImageDecoder(size, draft=False)(data)
    assert (out.int() - fused.int()).abs().float().mean() < 3


def test_the_batch_decoder_keeps_order_and_size():
    colors = [color_of(i) for i in range(5)]
    images = [
        EncodedImage(solid(c, 30 + 9 * i, 50), (16, 24), f"k{i}", "cpu")
        for i, c in enumerate(colors)
    ]
    out = EncodedBatchDecoder(CPU)(images)
    assert out.shape == (5, 3, 16, 24) and out.dtype == torch.uint8
    means = out.float().mean(dim=(2, 3))
    assert torch.allclose(means, torch.tensor(colors, dtype=torch.float32), atol=3)


def test_png_and_jpeg_mix_in_one_batch():
    images = [
        EncodedImage(solid((10, 200, 10), fmt="PNG"), (8, 8), "a.png", "cpu"),
        EncodedImage(solid((200, 10, 10)), (8, 8), "b.jpg", "cpu"),
    ]
    out = EncodedBatchDecoder(CPU)(images)
    assert torch.equal(
        out[0], torch.tensor([10, 200, 10], dtype=torch.uint8).view(3, 1, 1).expand(3, 8, 8)
    )


def test_an_undecodable_image_is_named_among_good_ones():
    good = [
        EncodedImage(noisy_jpeg(64, 48, i), (16, 16), f"s3://b/{i}.jpg", "cpu") for i in range(3)
    ]
    data = noisy_jpeg(256, 192)
    bad = EncodedImage(data[: len(data) // 2], (16, 16), "s3://b/bad.jpg", "cpu")
    with pytest.raises(DecodeError) as info:
        EncodedBatchDecoder(CPU)([good[0], bad, good[1]])
    assert info.value.url == "s3://b/bad.jpg" and info.value.cause == "Undecodable"


def test_decode_on_cuda_without_cuda_is_a_config_error_at_the_first_batch():
    images = [EncodedImage(solid((1, 2, 3)), (8, 8), "k", "cuda")]
    if torch.cuda.is_available():
        pytest.skip("CUDA is available here")
    with pytest.raises(ConfigError, match="CUDA is not available"):
        EncodedBatchDecoder(CPU)(images)
    with pytest.raises(ConfigError, match="CUDA is not available"):
        next(iter(CUDAPrefetcher([[images, torch.tensor([0])]], device="cuda")))


def test_decode_on_cuda_without_torchvision_is_a_config_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "torchvision", None)
    monkeypatch.setitem(sys.modules, "torchvision.io", None)
    with pytest.raises(ConfigError, match="needs torchvision"):
        TorchvisionDecoder()


def test_mixed_sizes_in_one_batch_are_refused():
    images = [EncodedImage(solid((1, 2, 3)), s, "k", "cpu") for s in ((8, 8), (9, 9))]
    with pytest.raises(ConfigError, match="mixes"):
        EncodedBatchDecoder(CPU)(images)


def test_only_top_level_lists_of_encoded_images_are_decoded():
    images = [EncodedImage(solid((9, 9, 9)), (4, 4), "k", "cpu")]
    decoder = EncodedBatchDecoder(CPU)
    batch, paths = decode_images({"image": images, "name": ["x"], "raw": [b"x"]}, decoder)
    assert batch["image"].shape == (1, 3, 4, 4) and batch["name"] == ["x"] and paths == {("image",)}
    batch, paths = decode_images((torch.zeros(1), images), decoder)
    assert isinstance(batch, tuple) and batch[1].shape == (1, 3, 4, 4) and paths == {(1,)}
    assert decode_images(images, decoder)[0].shape == (1, 3, 4, 4)
    plain = [torch.zeros(2), [b"a", b"b"]]
    assert decode_images(plain, decoder) == (plain, frozenset())


def run(
    root: Path, decode_on: str | None, seed: int, **loader: Any
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    ds = ImageFolder(root, image_size=(20, 24), decode_on=decode_on)
    dl = ConcurrentDataLoader(
        ds, batch_size=4, shuffle=True, generator=torch.Generator().manual_seed(seed), **loader
    )
    pf = CUDAPrefetcher(
        dl, device="cpu", mean=MEAN, std=STD, dtype=torch.bfloat16, channels_last=True
    )
    try:
        return [(x, y) for x, y in pf]
    finally:
        pf.close()
        ds.close()


def test_bytes_path_delivers_what_the_cpu_path_does_item_for_item(tmp_path):
    made = make_folder(tmp_path)
    encoded = run(tmp_path, "cpu", seed=3, num_workers=2)
    decoded = run(tmp_path, None, seed=3, num_workers=2)
    assert [y.tolist() for _, y in encoded] == [y.tolist() for _, y in decoded]
    assert sum(len(y) for _, y in encoded) == len(made)
    for (xe, ye), (xd, _) in zip(encoded, decoded, strict=True):
        assert xe.dtype == torch.bfloat16 and xe.shape == (len(ye), 3, 20, 24)
        assert xe.is_contiguous(memory_format=torch.channels_last)
        assert (xe.float() - xd.float()).abs().mean() < 0.05  # a level is 1/(255*std) ~ 0.017
    # Labels match the images: each image's colour is one of its class's colours.
    std, mean = torch.tensor(STD).view(3, 1, 1), torch.tensor(MEAN).view(3, 1, 1)
    by_class = {c: [color_of(n) for n, cc in made.values() if cc == c] for c in range(3)}
    for x, y in encoded:
        for image, label in zip(x, y, strict=True):
            rgb = ((image.float() * std + mean) * 255).mean(dim=(1, 2))
            nearest = min(by_class[int(label)], key=lambda c: (rgb - torch.tensor(c)).abs().sum())
            assert (rgb - torch.tensor(nearest, dtype=torch.float32)).abs().max() < 4


@pytest.mark.parametrize("method", ["spawn", "fork", "forkserver"])
def test_workers_ship_encoded_images_intact(tmp_path, method):
    make_folder(tmp_path, classes=2, per_class=3)
    ds = ImageFolder(tmp_path, image_size=8, decode_on="cpu")
    dl = ConcurrentDataLoader(ds, batch_size=3, num_workers=2, multiprocessing_context=method)
    try:
        batches = list(dl)
    finally:
        ds.close()
    images = [im for images, _ in batches for im in images]
    assert all(type(im) is EncodedImage and im.size == (8, 8) for im in images)
    assert [im.url for im in images] == [url for url, _ in ds.samples]


def test_a_corrupt_image_in_a_folder_raises_naming_it_even_when_skipping(tmp_path):
    make_folder(tmp_path, classes=2, per_class=3)
    data = noisy_jpeg(256, 192)
    (tmp_path / "c1" / "broken.jpg").write_bytes(data[: len(data) // 2])
    ds = ImageFolder(tmp_path, image_size=8, decode_on="cpu")
    dl = ConcurrentDataLoader(ds, batch_size=4, num_workers=1, on_error="skip")
    pf = CUDAPrefetcher(dl, device="cpu")
    try:
        with pytest.raises(DecodeError) as info:
            for _ in pf:
                pass
        assert info.value.url is not None and info.value.url.endswith("c1/broken.jpg")
    finally:
        pf.close()
        ds.close()


def test_closing_early_leaves_no_thread(tmp_path):
    make_folder(tmp_path)
    ds = ImageFolder(tmp_path, image_size=8, decode_on="cpu")
    dl = ConcurrentDataLoader(ds, batch_size=2, num_workers=2)
    pf = CUDAPrefetcher(dl, device="cpu", depth=2, mean=MEAN, std=STD)
    try:
        for x, _ in pf:
            assert x.dtype == torch.float32
            break
    finally:
        pf.close()
        ds.close()


def test_shard_samples_with_decode_on_arrive_decoded_in_order():
    import tarfile

    from concurrent_loader import ImageSample, ShardDataset
    from concurrent_loader.testing.memory import MemoryConfig

    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for i in range(6):
            for name, data in ((f"s{i}.jpg", solid(color_of(i))), (f"s{i}.cls", b"%d" % (i % 2))):
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    store = MemoryConfig({"a.tar": out.getvalue()}, name="m")
    ds = ShardDataset(store, decode=ImageSample(8, decode_on="cpu"))
    pf = CUDAPrefetcher(ConcurrentDataLoader(ds, batch_size=4), device="cpu")
    try:
        batches = list(pf)
    finally:
        pf.close()
        ds.close()
    images = torch.cat([x for x, _ in batches]).float().mean(dim=(2, 3))
    labels = torch.cat([y for _, y in batches])
    assert torch.allclose(images, torch.tensor([color_of(i) for i in range(6)]).float(), atol=3)
    assert labels.tolist() == [0, 1, 0, 1, 0, 1]


@pytest.mark.parametrize(("width", "height"), [(500, 375), (375, 500), (333, 257), (299, 256)])
def test_resize_crop_with_resize_size_matches_the_cpu_fused_decode(width, height):
    data = noisy_jpeg(width, height)
    out = resize_crop(ImageDecoder(None)(data), (224, 224), resize_size=256)
    assert out.shape == (3, 224, 224) and out.dtype == torch.uint8
    fused = ImageDecoder(224, resize_size=256, draft=False)(data)
    assert (out.int() - fused.int()).abs().float().mean() < 3


@pytest.mark.parametrize(("width", "height"), [(341, 256), (256, 385), (301, 256)])
def test_an_image_stored_at_resize_size_is_cropped_as_the_cpu_path_crops_it(width, height):
    data = noisy_jpeg(width, height, seed=3)
    images = [EncodedImage(data, (224, 224), "k", "cpu", resize_size=256)] * 2
    out = EncodedBatchDecoder(CPU)(images)
    expected = ImageDecoder(224, resize_size=256)(data)  # a crop, at torchvision's offsets
    assert torch.equal(out[0], expected) and torch.equal(out[1], expected)


def test_a_batch_mixing_resize_sizes_is_refused():
    images = [EncodedImage(solid((1, 2, 3)), (8, 8), "k", "cpu", resize_size=r) for r in (None, 10)]
    with pytest.raises(ConfigError, match="resize_size"):
        EncodedBatchDecoder(CPU)(images)
