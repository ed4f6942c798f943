"""End to end: a loader over a proxy that corrupts bodies, or sends stray bytes after a
response, in front of SeaweedFS never yields a wrong sample. Every sample's SHA-256 is
compared with what was uploaded (boto3's default CRC32 is on each object), with and
without the node cache, and for an object read in ranged parts.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from concurrent_loader import ConcurrentDataLoader, FetchConfig, ObjectDataset, RetryConfig
from concurrent_loader.errors import IntegrityError, Reason
from concurrent_loader.fetch.parts import PartsConfig
from concurrent_loader.stores import S3Config
from concurrent_loader.testing import FaultPlan, LocalS3Server

BUCKET = "integrity-loader"
PREFIX = "objects/"
BIG_PREFIX = "big/"
RETRY = FetchConfig(
    max_inflight_requests=4,
    retry=RetryConfig(max_attempts=8, base_delay=0.005, max_delay=0.02),
)


def sha256_hex(data: bytes | bytearray) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclass(frozen=True)
class Objects:
    keys: list[str]
    digests: list[str]
    #: a 3 MB object under BIG_PREFIX, read in 1 MB parts
    big: bytes


@pytest.fixture(scope="module")
def objects(s3_server: LocalS3Server) -> Objects:
    s3_server.create_bucket(BUCKET)
    rng = random.Random(1127)
    bodies = {f"{i:03d}.bin": rng.randbytes(rng.randint(20_000, 150_000)) for i in range(32)}
    big = rng.randbytes(3_000_000)
    client = s3_server.client()
    try:
        for key, body in bodies.items():
            client.put_object(Bucket=BUCKET, Key=PREFIX + key, Body=body)
        client.put_object(Bucket=BUCKET, Key=BIG_PREFIX + "big.bin", Body=big)
    finally:
        client.close()
    keys = sorted(bodies)
    return Objects(keys, [sha256_hex(bodies[key]) for key in keys], big)


def batches_or_errors(loader: ConcurrentDataLoader) -> Iterator[list[str] | BaseException]:
    """Each batch of the epoch, or the error it was raised with (the epoch goes on)."""
    iterator = iter(loader)
    for _ in range(len(loader)):
        try:
            yield list(next(iterator))
        except IntegrityError as exc:
            exc.__traceback__ = None
            yield exc


def load(
    objects: Objects, proxy: Any, cache: Path | None, epochs: int = 1
) -> list[list[str] | BaseException]:
    ds = ObjectDataset(
        S3Config.from_url(f"s3://{BUCKET}/{PREFIX}", endpoint_url=proxy.endpoint_url),
        objects.keys,
        decode=sha256_hex,
        fetch_config=RETRY,
        cache=cache,
    )
    loader = ConcurrentDataLoader(ds, batch_size=8)
    try:
        return [item for _ in range(epochs) for item in batches_or_errors(loader)]
    finally:
        ds.close()


@pytest.fixture
def env(s3_env: dict[str, str]) -> None:
    return None


@pytest.mark.parametrize("cached", [False, True], ids=["store", "cache"])
def test_corrupted_bodies_are_fetched_again_and_every_sample_is_right(
    objects: Objects,
    env: None,
    proxy_factory: Callable[..., Any],
    tmp_path: Path,
    cached: bool,
) -> None:
    proxy = proxy_factory(faults=FaultPlan(seed=11, corrupt=0.3))
    epochs = 2 if cached else 1  # the second from the cache, which only took checked bodies
    got = load(objects, proxy, tmp_path / "cache" if cached else None, epochs)
    want = [objects.digests[i : i + 8] for i in range(0, len(objects.keys), 8)] * epochs
    assert got == want
    assert proxy.stats()["faults"]["corrupt"] > 0


@pytest.mark.parametrize("cached", [False, True], ids=["store", "cache"])
def test_bodies_corrupted_every_time_end_in_integrity_error_never_in_a_sample(
    objects: Objects,
    env: None,
    proxy_factory: Callable[..., Any],
    tmp_path: Path,
    cached: bool,
) -> None:
    proxy = proxy_factory(faults=FaultPlan(corrupt=1.0))
    got = load(objects, proxy, tmp_path / "cache" if cached else None)
    assert got, "the loader yielded nothing"
    for item in got:
        assert isinstance(item, IntegrityError), f"a batch of corrupted bodies was yielded: {item}"
        assert item.cause == Reason.CHECKSUM_MISMATCH
        assert item.url is not None and item.url.startswith(f"s3://{BUCKET}/{PREFIX}")


@pytest.mark.parametrize("cached", [False, True], ids=["store", "cache"])
def test_stray_bytes_after_a_response_never_become_a_sample(
    objects: Objects,
    env: None,
    proxy_factory: Callable[..., Any],
    tmp_path: Path,
    cached: bool,
) -> None:
    # Every body ends with a stray response in the same write; several epochs of GETs
    # waiting for connections give a transport that reuses such a connection many chances
    # to read one as a sample.
    proxy = proxy_factory(faults=FaultPlan(seed=5, stray_bytes=1.0))
    # With the cache, later epochs read what the first one wrote: only checked bodies.
    got = load(objects, proxy, tmp_path / "cache" if cached else None, epochs=4)
    stray = sha256_hex(b"stray")
    assert not [item for item in got if isinstance(item, list) and stray in item]
    want = [objects.digests[i : i + 8] for i in range(0, len(objects.keys), 8)] * 4
    assert got == want
    assert proxy.stats()["faults"]["stray_bytes"] > 0


@pytest.mark.parametrize("corrupt", [0.3, 1.0])
def test_an_object_read_in_parts_is_checked_once_assembled(
    objects: Objects, env: None, proxy_factory: Callable[..., Any], corrupt: float
) -> None:
    """Ranged responses carry no checksum (neither server sends one): the whole object is
    checked once assembled, here against its ETag taken as MD5 (``verify_etag_md5``)."""
    proxy = proxy_factory(faults=FaultPlan(seed=3, corrupt=corrupt))
    ds = ObjectDataset(  # listed, so its size is known and it is read in parts
        S3Config.from_url(
            f"s3://{BUCKET}/{BIG_PREFIX}", endpoint_url=proxy.endpoint_url, verify_etag_md5=True
        ),
        decode=sha256_hex,
        fetch_config=RETRY,
        parts=PartsConfig(part_size=1_000_000),
    )
    loader = ConcurrentDataLoader(ds, batch_size=1)
    try:
        got = list(batches_or_errors(loader))
    finally:
        ds.close()
    assert proxy.stats()["requests_by_method"]["GET"] >= 3  # the parts, each a ranged GET
    if corrupt < 1.0:
        assert got == [[sha256_hex(objects.big)]]
        assert proxy.stats()["faults"]["corrupt"] > 0
    else:
        assert len(got) == 1 and isinstance(got[0], IntegrityError)
        assert got[0].cause == Reason.CHECKSUM_MISMATCH
        assert got[0].url == f"s3://{BUCKET}/{BIG_PREFIX}big.bin"
        assert hashlib.md5(objects.big).hexdigest() in str(got[0])
