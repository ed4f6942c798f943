"""The stores the conformance suite (``test_conformance.py``) holds to one contract.

Each store under test is one fixture decorated with :func:`store_case`: it puts
:data:`OBJECTS` where the backend reads them and returns a :class:`Case`, the store config
plus what that backend defines where backends may differ (a range past the object's end,
a read after ``close``). A new backend, or a new wrapper, is proven by adding one such
fixture; every check then runs against it.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import pytest

from concurrent_loader.cache import CacheConfig, CachedStoreConfig
from concurrent_loader.stores import HttpConfig, LocalConfig, StoreConfig
from concurrent_loader.stores.readahead import Readahead, ReadaheadConfig
from concurrent_loader.stores.s3 import S3Config
from concurrent_loader.testing import LocalS3Server, MotoS3Server, RcloneS3Server, S3ServerProcess
from concurrent_loader.testing.azurite_server import AzuriteServer
from concurrent_loader.testing.files import FileServer
from concurrent_loader.testing.gcs_server import FakeGcsServer
from concurrent_loader.testing.memory import MemoryConfig
from tests.helpers import helpers, no_loader_threads_left

_rng = random.Random(20260601)

#: key (relative to the store's root) -> bytes; every backend serves exactly these
OBJECTS: dict[str, bytes] = {
    "small.bin": _rng.randbytes(1000),
    "nested/dir/big.bin": _rng.randbytes(200_000),
    "empty.bin": b"",
    "odd name+%.bin": _rng.randbytes(300),
}

BUCKET = "conformance"
PREFIX = "stores/"


@dataclass(frozen=True)
class Case:
    """A store config serving :data:`OBJECTS`, and the behaviours its backend defines.

    - ``past_end``: a range that runs past the object's end is ``"short"`` (the bytes up
      to the end, none for a range wholly past it, as slicing gives) or an ``"error"`` (a
      ``FetchError``: the file is shorter than asked, or the server's ``Content-Range`` /
      416 says so);
    - ``after_close``: a ``get`` after ``close`` ``"works"`` (nothing was held open) or is
      an ``"error"`` (a ``RuntimeError``: the connection pool is closed);
    - ``ranges_limited_by_span``: a range is read as the larger span around it, so
      ``max_object_bytes`` applies to the span, not to the range (read-ahead).
    """

    config: StoreConfig
    past_end: Literal["short", "error"]
    after_close: Literal["works", "error"]
    ranges_limited_by_span: bool = False


#: the names of the fixtures decorated with :func:`store_case`, in order
CASES: list[str] = []


def store_case(make: Callable[..., Case]) -> Any:
    """Make ``make`` a fixture and a case of the conformance suite."""
    CASES.append(make.__name__)
    return pytest.fixture(make)


def _write_tree(root: Path) -> Path:
    for key, data in OBJECTS.items():
        (root / key).parent.mkdir(parents=True, exist_ok=True)
        (root / key).write_bytes(data)
    return root


@pytest.fixture(scope="session")
def objects_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """:data:`OBJECTS` as files under a directory of their own."""
    return _write_tree(tmp_path_factory.mktemp("conformance"))


@pytest.fixture(scope="session")
def file_server(objects_dir: Path) -> Iterator[FileServer]:
    with FileServer(objects_dir) as server:
        yield server


def _filled(server: S3ServerProcess) -> S3ServerProcess:
    if not getattr(server, "_conformance_filled", False):
        server.create_bucket(BUCKET)
        for key, data in OBJECTS.items():
            server.put_object(BUCKET, PREFIX + key, data)
        server._conformance_filled = True  # type: ignore[attr-defined]
    return server


def _s3_config(server: S3ServerProcess) -> S3Config:
    _filled(server)
    return S3Config.from_url(
        f"s3://{BUCKET}/{PREFIX}",
        endpoint_url=server.endpoint_url,
        region=server.region,
        aws_access_key_id=server.access_key,
        aws_secret_access_key=server.secret_key,
    ).resolved()


# ---------------------------------------------------------------------- backends


@store_case
def memory_store() -> Case:
    return Case(MemoryConfig(dict(OBJECTS)), past_end="short", after_close="works")


@store_case
def memory_blocking_store() -> Case:
    """The in-memory store read as a local one is (``remote=False``: blocking reads)."""
    return Case(MemoryConfig(dict(OBJECTS), remote=False), past_end="short", after_close="works")


@store_case
def local_store(objects_dir: Path) -> Case:
    return Case(LocalConfig.from_path(str(objects_dir)), past_end="error", after_close="works")


@store_case
def s3_seaweedfs_store(s3_server: LocalS3Server, aws_env: Callable[..., Any]) -> Case:
    aws_env(s3_server)
    return Case(_s3_config(s3_server), past_end="error", after_close="error")


@store_case
def s3_moto_store(moto_server: MotoS3Server, aws_env: Callable[..., Any]) -> Case:
    aws_env(moto_server)
    return Case(_s3_config(moto_server), past_end="error", after_close="error")


@store_case
def azure_store(azurite_server: AzuriteServer) -> Case:
    if not getattr(azurite_server, "_conformance_filled", False):
        azurite_server.create_bucket(BUCKET)
        for key, data in OBJECTS.items():
            azurite_server.put_object(BUCKET, PREFIX + key, data)
        azurite_server._conformance_filled = True  # type: ignore[attr-defined]
    config = azurite_server.store_config(BUCKET, PREFIX)
    return Case(config, past_end="error", after_close="error")


@store_case
def s3_rclone_store(rclone_server: RcloneS3Server, aws_env: Callable[..., Any]) -> Case:
    aws_env(rclone_server)
    return Case(_s3_config(rclone_server), past_end="error", after_close="error")


@store_case
def http_store(file_server: FileServer) -> Case:
    return Case(
        HttpConfig.from_url(file_server.endpoint_url + "/"), past_end="error", after_close="error"
    )


@store_case
def gcs_store(gcs_server: FakeGcsServer) -> Case:
    if not getattr(gcs_server, "_conformance_filled", False):
        gcs_server.create_bucket(BUCKET)
        for key, data in OBJECTS.items():
            gcs_server.put_object(BUCKET, PREFIX + key, data)
        gcs_server._conformance_filled = True  # type: ignore[attr-defined]
    return Case(gcs_server.store_config(BUCKET, PREFIX), past_end="error", after_close="error")


# ---------------------------------------------------------------------- wrappers


@store_case
def node_cache_store(tmp_path: Path) -> Case:
    cache = CacheConfig(str(tmp_path / "cache"), max_bytes=10_000_000).resolved()
    return Case(
        CachedStoreConfig(MemoryConfig(dict(OBJECTS)), cache), past_end="short", after_close="works"
    )


@store_case
def readahead_store() -> Case:
    sizes = {key: len(data) for key, data in OBJECTS.items()}
    return Case(
        ReadaheadConfig(
            MemoryConfig(dict(OBJECTS)), sizes, Readahead(span_bytes=4096, max_bytes=64 * 1024)
        ),
        past_end="short",
        after_close="works",
        ranges_limited_by_span=True,
    )


@pytest.fixture(params=CASES)
def case(request: pytest.FixtureRequest) -> Case:
    """Every store case in turn (keep this below the cases: it takes ``CASES`` as it is)."""
    made: Case = request.getfixturevalue(request.param)
    return made


__all__ = [
    "CASES",
    "OBJECTS",
    "Case",
    "helpers",
    "no_loader_threads_left",
    "store_case",
]
