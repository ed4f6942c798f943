"""examples/train.py runs end to end: from memory, from disk and from a local S3 server."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest
from PIL import Image

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "train.py"
SMALL = ["--steps", "2", "--warmup-steps", "1", "--batch-size", "4", "--image-size", "32"]


def weed_missing() -> bool:
    from concurrent_loader.testing import find_weed

    try:
        find_weed()
    except FileNotFoundError:
        return True
    return False


def load_example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("train_example", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def write_image_folder(root: Path, classes: int = 2, per_class: int = 5) -> Path:
    rng = np.random.default_rng(0)
    for c in range(classes):
        folder = root / f"class{c}"
        folder.mkdir(parents=True)
        for i in range(per_class):
            pixels = rng.integers(0, 256, (40, 48, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(folder / f"{i}.jpg", quality=85)
    return root


def test_synthetic(capsys: pytest.CaptureFixture[str]) -> None:
    assert load_example().main(["--synthetic", "--device", "cpu", *SMALL]) == 0
    out = capsys.readouterr().out
    assert "synthetic:" in out and "data stall 0.0%" in out


def test_local_disk(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = write_image_folder(tmp_path / "train")
    argv = ["--local", "--data-dir", str(data), "--num-workers", "0", "--device", "cpu", *SMALL]
    assert load_example().main(argv) == 0
    out = capsys.readouterr().out
    assert "10 images in 2 classes" in out
    assert "loader-fed rate / synthetic rate" in out


@pytest.mark.slow
@pytest.mark.skipif(weed_missing(), reason="needs the weed binary (the testing extra)")
def test_local_s3_server_behind_a_latency_proxy(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = write_image_folder(tmp_path / "train")
    argv = [
        "--start-server",
        "--data-dir",
        str(data),
        "--latency-ms",
        "5",
        "--num-workers",
        "0",
        "--device",
        "cpu",
        *SMALL,
    ]
    assert load_example().main(argv) == 0
    out = capsys.readouterr().out
    assert "local S3 server + 5 ms latency, s3://train-data/train/" in out
    assert "loader-fed rate / synthetic rate" in out
