"""Fixtures of the Azure end-to-end tests: Azurite (the session's ``azurite_server``) filled
once with the image folder and a set of small and large blobs, the environment pointing
Azure's credential chain at it, and fault proxies in front of it."""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from concurrent_loader.testing import ProxyProcess
from concurrent_loader.testing.azurite_server import AzuriteServer

IMAGES = "images"
BLOBS = "blobs"
SMALL = 120
LARGE_BYTES = 3 * 2**20 + 12345


@dataclass(frozen=True)
class Blobs:
    """Small blobs ``small/NNNN.bin`` and one large blob, with their sha256 digests."""

    keys: list[str]
    digests: list[str]
    large_key: str
    large: bytes


@pytest.fixture
def azure_env(monkeypatch: pytest.MonkeyPatch, azurite_server: AzuriteServer) -> str:
    """Azure's chain pointed at Azurite (``AZURE_STORAGE_CONNECTION_STRING``) for this test,
    with nothing else of the developer's Azure or proxy setup; returns the string."""
    for name in ("AZURE_STORAGE_ACCOUNT", "AZURE_STORAGE_KEY", "AZURE_STORAGE_SAS_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", azurite_server.connection_string)
    return azurite_server.connection_string


@pytest.fixture(scope="session")
def azure_images(
    azurite_server: AzuriteServer, image_folder: tuple[Path, list[tuple[str, str, str]]]
) -> tuple[Path, list[tuple[str, str, str]]]:
    """The image folder, also under ``az://images/train/``."""
    root, files = image_folder
    azurite_server.create_bucket(IMAGES)
    azurite_server.upload_dir(root, IMAGES, prefix="train/")
    return root, files


@pytest.fixture(scope="session")
def azure_blobs(azurite_server: AzuriteServer) -> Blobs:
    rng = random.Random(20261127)
    azurite_server.create_bucket(BLOBS)
    keys, digests = [], []
    for i in range(SMALL):
        data = rng.randbytes(rng.randrange(200, 4000))
        keys.append(f"small/{i:04d}.bin")
        digests.append(hashlib.sha256(data).hexdigest())
        azurite_server.put_object(BLOBS, keys[-1], data)
    large = rng.randbytes(LARGE_BYTES)
    azurite_server.put_object(BLOBS, "large/one.bin", large)
    return Blobs(keys, digests, "large/one.bin", large)


@pytest.fixture
def azure_proxy(azurite_server: AzuriteServer) -> Iterator[Callable[..., ProxyProcess]]:
    """``make(**ProxyProcess kwargs)`` -> a started proxy in front of Azurite."""
    started: list[ProxyProcess] = []

    def make(**kwargs: Any) -> ProxyProcess:
        proxy = ProxyProcess(f"http://127.0.0.1:{azurite_server.port}", **kwargs)
        started.append(proxy)
        return proxy.start()

    yield make
    for proxy in reversed(started):
        proxy.stop()


def through(proxy: ProxyProcess, server: AzuriteServer) -> str:
    """The endpoint of ``server``'s account through ``proxy``."""
    return f"{proxy.endpoint_url}/{server.account}"
