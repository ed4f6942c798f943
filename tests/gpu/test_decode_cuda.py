"""``decode_on="cuda"`` on a real GPU: nvJPEG batch decode against the CPU fused decode,
and ImageFolder -> ConcurrentDataLoader -> CUDAPrefetcher end to end."""

from __future__ import annotations

import importlib.util
import io
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from concurrent_loader import ConcurrentDataLoader, ImageFolder
from concurrent_loader.decode import EncodedImage, ImageDecoder
from concurrent_loader.errors import DecodeError
from concurrent_loader.gpu import CUDAPrefetcher, EncodedBatchDecoder

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not torch.cuda.is_available(),
        reason="needs CUDA: decodes JPEG batches with nvJPEG on the GPU",
    ),
    pytest.mark.skipif(
        importlib.util.find_spec("torchvision") is None,
        reason="needs torchvision (torchvision.io.decode_jpeg) for the GPU decode",
    ),
    pytest.mark.usefixtures("no_new_threads"),
]

MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)


def photo(w: int, h: int, seed: int) -> bytes:
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:h, 0:w]
    base = np.stack([xx * 255 // w, yy * 255 // h, (xx + yy) * 255 // (w + h)], -1)
    pixels = np.clip(base + rng.integers(0, 20, (h, w, 3)), 0, 255).astype(np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, "JPEG", quality=90)
    return buf.getvalue()


def make_folder(root: Path, classes: int = 3, per_class: int = 6) -> None:
    for c in range(classes):
        (root / f"c{c}").mkdir(parents=True)
        for i in range(per_class):
            data = photo(200 + 37 * i, 150 + 23 * c, seed=10 * c + i)
            (root / f"c{c}" / f"{i}.jpg").write_bytes(data)


@pytest.mark.parametrize("size", [(224, 224), (96, 160)])
def test_a_batch_decoded_on_the_gpu_is_close_to_the_cpu_fused_decode(size):
    datas = [photo(500, 375, 1), photo(375, 500, 2), photo(640, 480, 3), photo(230, 230, 4)]
    images = [EncodedImage(d, size, f"s3://b/{i}.jpg", "cuda") for i, d in enumerate(datas)]
    device = torch.device("cuda", torch.cuda.current_device())
    out = EncodedBatchDecoder(device)(images)
    assert out.device == device and out.dtype == torch.uint8 and out.shape == (4, 3, *size)
    for got, data in zip(out.cpu(), datas, strict=True):
        fused = ImageDecoder(size)(data)  # draft mode: a reduced-scale IDCT, then resize
        diff = (got.int() - fused.int()).abs().float().mean()
        print(f"{size}: mean abs diff to the CPU fused decode {diff:.2f} levels")
        assert diff < 4


def test_resize_size_on_the_gpu_is_close_to_the_cpu_fused_decode():
    # Originals (resized to 256 on the GPU) and images stored at short side 256 (cropped).
    datas = [photo(500, 375, 1), photo(375, 500, 2), photo(341, 256, 3), photo(256, 384, 4)]
    images = [
        EncodedImage(d, (224, 224), f"s3://b/{i}.jpg", "cuda", resize_size=256)
        for i, d in enumerate(datas)
    ]
    device = torch.device("cuda", torch.cuda.current_device())
    out = EncodedBatchDecoder(device)(images)
    assert out.device == device and out.shape == (4, 3, 224, 224)
    for got, data in zip(out.cpu(), datas, strict=True):
        fused = ImageDecoder(224, resize_size=256)(data)
        diff = (got.int() - fused.int()).abs().float().mean()
        print(f"resize_size=256: mean abs diff to the CPU fused decode {diff:.2f} levels")
        assert diff < 4


def test_png_and_a_corrupt_jpeg_in_a_gpu_batch():
    device = torch.device("cuda", torch.cuda.current_device())
    png = io.BytesIO()
    Image.fromarray(np.full((40, 60, 3), (10, 200, 30), np.uint8)).save(png, "PNG")
    good = EncodedImage(photo(300, 200, 5), (32, 32), "s3://b/good.jpg", "cuda")
    out = EncodedBatchDecoder(device)([good, EncodedImage(png.getvalue(), (32, 32), "p", "cuda")])
    assert out[1].float().mean(dim=(1, 2)).cpu().tolist() == [10, 200, 30]
    data = photo(640, 480, 6)
    bad = EncodedImage(data[:200] + bytes(len(data) - 200), (32, 32), "s3://b/bad.jpg", "cuda")
    with pytest.raises(DecodeError) as info:
        EncodedBatchDecoder(device)([good, bad])
    assert info.value.url == "s3://b/bad.jpg"


def run(root: Path, decode_on: str | None) -> list[tuple[torch.Tensor, torch.Tensor]]:
    ds = ImageFolder(root, image_size=64, decode_on=decode_on)
    dl = ConcurrentDataLoader(
        ds,
        batch_size=5,
        shuffle=True,
        num_workers=2,
        pin_memory=True,
        generator=torch.Generator().manual_seed(7),
    )
    pf = CUDAPrefetcher(
        dl, device="cuda", depth=2, mean=MEAN, std=STD, dtype=torch.bfloat16, channels_last=True
    )
    try:
        return [(x.float().cpu(), y.cpu()) for x, y in pf]
    finally:
        pf.close()
        ds.close()


def test_image_folder_decoded_on_the_gpu_end_to_end(tmp_path):
    make_folder(tmp_path)
    ds = ImageFolder(tmp_path, image_size=64, decode_on="cuda")
    dl = ConcurrentDataLoader(ds, batch_size=5, num_workers=2, pin_memory=True)
    pf = CUDAPrefetcher(
        dl, device="cuda", mean=MEAN, std=STD, dtype=torch.bfloat16, channels_last=True
    )
    try:
        for x, y in pf:
            assert x.is_cuda and x.dtype == torch.bfloat16 and x.shape[1:] == (3, 64, 64)
            assert x.is_contiguous(memory_format=torch.channels_last) and len(y) == len(x)
            torch.cuda.synchronize()
    finally:
        pf.close()
        ds.close()
    gpu, cpu = run(tmp_path, "cuda"), run(tmp_path, None)
    assert [y.tolist() for _, y in gpu] == [y.tolist() for _, y in cpu]
    for (xg, _), (xc, _) in zip(gpu, cpu, strict=True):
        # A level is 1/(255*std) ~ 0.017 here: a mean of a few levels.
        assert (xg - xc).abs().mean() < 0.08
