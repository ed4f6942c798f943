"""Fixtures of the shard tests: generated samples packed into shards, locally and in S3.

``packed`` is 480 samples (a ``.bin`` of 1-3 KB of random bytes and a ``.txt`` label each,
seeded) packed by ``concurrent-loader pack`` into shards of about 300 KB, once per test
session; the same shard files are uploaded under ``s3://test-data/shards/``. ``expected``
maps each sample key to its members' bytes, straight from the generated files.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from concurrent_loader.shards.pack import pack
from concurrent_loader.testing import LocalS3Server

SAMPLES = 480
SHARD_SIZE = 300_000
PREFIX = "shards/"


def webdataset_samples(paths: list[Path]) -> list[dict[str, Any]]:
    """The samples the ``webdataset`` library reads from the tar files ``paths``, in order:
    its own tar iteration and grouping (``tar_file_expander``, ``group_by_keys``), the
    stages ``WebDataset`` chains, over files this helper opens and closes (``WebDataset``
    itself leaves its file objects to the garbage collector, which the suite's
    ``ResourceWarning`` filter turns into errors)."""
    from webdataset.tariterators import group_by_keys, tar_file_expander

    samples: list[dict[str, Any]] = []
    for path in paths:
        with open(path, "rb") as stream:
            files = tar_file_expander([{"url": str(path), "stream": stream}])
            samples.extend(group_by_keys(files))
    return samples


@dataclass(frozen=True)
class Packed:
    source: Path  # the generated objects
    local: Path  # the shards and indexes on disk
    bucket: str
    prefix: str
    shards: list[str]
    expected: dict[str, dict[str, bytes]]  # sample key -> {extension: bytes}
    order: list[str]  # sample keys in global index order

    @property
    def s3_url(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}"


def write_samples(root: Path, n: int = SAMPLES, seed: int = 5) -> dict[str, dict[str, bytes]]:
    rng = np.random.default_rng(seed)
    expected: dict[str, dict[str, bytes]] = {}
    root.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        key = f"s{i:04d}"
        body = rng.integers(0, 256, size=int(rng.integers(1000, 3000)), dtype=np.uint8).tobytes()
        label = str(i % 7).encode()
        (root / f"{key}.bin").write_bytes(body)
        (root / f"{key}.txt").write_bytes(label)
        expected[key] = {"bin": body, "txt": label}
    return expected


@pytest.fixture(scope="session")
def packed(
    tmp_path_factory: pytest.TempPathFactory, s3_server: LocalS3Server, s3_bucket: str
) -> Packed:
    base = tmp_path_factory.mktemp("shards")
    expected = write_samples(base / "objects")
    result = pack(str(base / "objects"), str(base / "packed"), shard_size=SHARD_SIZE)
    s3_server.upload_dir(base / "packed", s3_bucket, prefix=PREFIX)
    return Packed(
        source=base / "objects",
        local=base / "packed",
        bucket=s3_bucket,
        prefix=PREFIX,
        shards=result.shards,
        expected=expected,
        order=sorted(expected),
    )


@pytest.fixture
def shard_copy(tmp_path: Path, packed: Packed) -> Callable[[], Path]:
    """``copy()``: a private copy of the packed shards on disk, for a test to damage."""

    def copy() -> Path:
        target = tmp_path / "copy"
        shutil.copytree(packed.local, target)
        return target

    return copy
