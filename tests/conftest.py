"""Shared fixtures: real local S3 servers, a bucket, AWS env, proxies and an image dataset.

The servers and the dataset are session-scoped (one ``weed mini``, one moto server and one
``rclone serve s3`` per test session, each started only if a test asks for it); everything
a test changes (env vars, proxies) is undone at the end of that test.
"""

from __future__ import annotations

import faulthandler
import hashlib
import io
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from concurrent_loader.testing import (
    LocalS3Server,
    MotoS3Server,
    ProxyProcess,
    RcloneS3Server,
    S3ServerProcess,
)
from concurrent_loader.testing.azurite_server import AzuriteServer, find_azurite
from concurrent_loader.testing.gcs_server import FakeGcsServer

TEST_BUCKET = "test-data"
IMAGE_PREFIX = "images/train/"
IMAGE_CLASSES = ("apple", "banana", "cherry")
IMAGES_PER_CLASS = 8
IMAGE_SEED = 20240607


#: seconds the test process may take to exit once the session is over; then every thread's
#: stack is printed and it exits with status 1 (a thread that never ends must not hang CI)
EXIT_TIMEOUT_S = 300


def pytest_unconfigure(config: pytest.Config) -> None:
    faulthandler.dump_traceback_later(EXIT_TIMEOUT_S, exit=True)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    gpu_items = [item for item in items if item.get_closest_marker("gpu") is not None]
    if not gpu_items:
        return  # keep torch out of runs that do not need it
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA")
    for item in gpu_items:
        item.add_marker(skip)


@pytest.fixture(scope="session")
def s3_server() -> Iterator[LocalS3Server]:
    """A started local S3 server, shared by the whole session."""
    with LocalS3Server() as server:
        yield server


@pytest.fixture(scope="session")
def moto_server() -> Iterator[MotoS3Server]:
    """A started moto server (authentication enforced), shared by the whole session."""
    with MotoS3Server() as server:
        yield server


@pytest.fixture(scope="session")
def gcs_server() -> Iterator[FakeGcsServer]:
    """A started fake-gcs-server (GCS JSON API, in memory), shared by the whole session."""
    with FakeGcsServer() as server:
        yield server


@pytest.fixture(scope="session")
def azurite_server() -> Iterator[AzuriteServer]:
    """A started Azurite (Azure Blob Storage emulator), shared by the whole session."""
    if find_azurite() is None:
        pytest.skip("azurite-blob is not installed: run scripts/setup.sh")
    with AzuriteServer() as server:
        yield server


@pytest.fixture(scope="session")
def rclone_server() -> Iterator[RcloneS3Server]:
    """A started ``rclone serve s3`` over a temporary directory, shared by the whole session."""
    with RcloneS3Server() as server:
        yield server


@pytest.fixture(scope="session")
def s3_bucket(s3_server: LocalS3Server) -> str:
    """The name of a bucket that exists on ``s3_server``."""
    s3_server.create_bucket(TEST_BUCKET)
    return TEST_BUCKET


# The developer's own AWS, proxy and trust store setup must not leak into tests.
_LEAKY_ENV = (
    "AWS_SESSION_TOKEN",
    "AWS_PROFILE",
    "AWS_DEFAULT_PROFILE",
    "AWS_ENDPOINT_URL_S3",
    "AWS_CA_BUNDLE",
    "REQUESTS_CA_BUNDLE",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "NO_PROXY",
    "http_proxy",
    "https_proxy",
    "no_proxy",
)


@pytest.fixture
def aws_env(monkeypatch: pytest.MonkeyPatch) -> Callable[[S3ServerProcess], dict[str, str]]:
    """``point_at(server)``: set ``server``'s AWS_* variables for this test and clear the
    rest (profiles, proxies, CA bundles); returns them."""

    def point_at(server: S3ServerProcess) -> dict[str, str]:
        env = server.env()
        for name in _LEAKY_ENV:
            monkeypatch.delenv(name, raising=False)
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        monkeypatch.setenv("AWS_CONFIG_FILE", os.devnull)
        monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", os.devnull)
        return env

    return point_at


@pytest.fixture
def s3_env(
    aws_env: Callable[[S3ServerProcess], dict[str, str]], s3_server: LocalS3Server
) -> dict[str, str]:
    """AWS_* variables pointing at ``s3_server`` for this test; returns them."""
    return aws_env(s3_server)


@pytest.fixture
def proxy_factory(s3_server: LocalS3Server) -> Iterator[Callable[..., ProxyProcess]]:
    """``make(upstream=None, **ProxyProcess kwargs)`` -> a started proxy, stopped at test end.

    The upstream defaults to ``s3_server``.
    """
    started: list[ProxyProcess] = []

    def make(upstream: str | None = None, **kwargs: Any) -> ProxyProcess:
        proxy = ProxyProcess(upstream or s3_server.endpoint_url, **kwargs)
        started.append(proxy)
        return proxy.start()

    yield make
    for proxy in reversed(started):
        proxy.stop()


@dataclass(frozen=True)
class ImageDataset:
    """A small ImageFolder-style JPEG dataset, on local disk and in the test bucket."""

    local_root: Path
    bucket: str
    prefix: str
    #: (key relative to ``local_root`` / the prefix, class name, sha256 hex of the bytes)
    files: list[tuple[str, str, str]]
    classes: list[str]

    @property
    def s3_url(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}"


def _make_jpeg(rng: np.random.Generator, class_index: int) -> bytes:
    width, height = (int(v) for v in rng.integers(64, 201, size=2))
    # Random 16 px blocks make every image distinct; a tint per class makes classes
    # tell apart by eye.
    blocks = rng.integers(0, 160, size=(height // 16 + 1, width // 16 + 1, 3), dtype=np.uint8)
    pixels = blocks.repeat(16, axis=0).repeat(16, axis=1)[:height, :width].copy()
    pixels[..., class_index % 3] += 95
    out = io.BytesIO()
    Image.fromarray(pixels, "RGB").save(out, format="JPEG", quality=90)
    return out.getvalue()


def write_image_folder(root: Path, seed: int = IMAGE_SEED) -> list[tuple[str, str, str]]:
    """Write the JPEGs under ``root/<class>/``; the same seed gives the same bytes."""
    rng = np.random.default_rng(seed)
    files = []
    for class_index, name in enumerate(IMAGE_CLASSES):
        (root / name).mkdir(parents=True, exist_ok=True)
        for i in range(IMAGES_PER_CLASS):
            data = _make_jpeg(rng, class_index)
            key = f"{name}/{name}_{i:03d}.jpg"
            (root / key).write_bytes(data)
            files.append((key, name, hashlib.sha256(data).hexdigest()))
    return files


@pytest.fixture(scope="session")
def image_folder(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[Path, list[tuple[str, str, str]]]:
    """The local root of the image dataset's files, and ``write_image_folder``'s list."""
    root = tmp_path_factory.mktemp("image_dataset") / "train"
    return root, write_image_folder(root)


@pytest.fixture(scope="session")
def image_dataset(
    image_folder: tuple[Path, list[tuple[str, str, str]]],
    s3_server: LocalS3Server,
    s3_bucket: str,
) -> ImageDataset:
    """3 classes x 8 JPEGs (64-200 px), locally and under ``s3://test-data/images/train/``."""
    root, files = image_folder
    s3_server.upload_dir(root, s3_bucket, prefix=IMAGE_PREFIX)
    return ImageDataset(
        local_root=root,
        bucket=s3_bucket,
        prefix=IMAGE_PREFIX,
        files=files,
        classes=sorted(IMAGE_CLASSES),
    )
