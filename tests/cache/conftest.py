"""Fixtures of the cache tests: a cache directory per test, objects that name themselves.

Every object body starts with its index, so a sample read back names the object it came
from. The autouse fixture checks that a test leaves none of the loader's threads (the
cache's writer included) running.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from concurrent_loader.cache import CacheConfig
from tests.helpers import no_loader_threads_left

__all__ = ["no_loader_threads_left"]


def body_for(index: int, size: int = 1000) -> bytes:
    return f"{index:06d}".encode().ljust(size, b".")


def index_of(data: bytes | bytearray) -> int:
    return int(bytes(data[:6]))


def numbered_objects(count: int, size: int = 1000) -> dict[str, bytes]:
    return {f"{i:05d}.bin": body_for(i, size) for i in range(count)}


@pytest.fixture
def cache_dir(tmp_path: Path) -> Path:
    return tmp_path / "cache"


@pytest.fixture
def cache_config(cache_dir: Path) -> CacheConfig:
    """A resolved config (1 MB budget, fill) for ``cache_dir``."""
    cache_dir.mkdir(exist_ok=True)
    return CacheConfig(str(cache_dir), max_bytes=1_000_000).resolved()
