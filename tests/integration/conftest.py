"""Fixtures of the end-to-end tests that run against every local S3 implementation.

``any_server`` is SeaweedFS (``s3_server``), moto (``moto_server``) or ``rclone serve s3``
(``rclone_server``): a test that uses it runs once against each. ``server_data`` is the
same data on each of them: the image dataset of ``tests/conftest.py`` and objects whose
keys a signer or a URL encoder can get wrong, uploaded once per server.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest

from concurrent_loader.runtime import acquire_runtime
from concurrent_loader.testing import S3ServerProcess, ServerCertificate, make_private_ca

DatasetT = TypeVar("DatasetT")

#: the servers ``any_server`` runs each test against, and their session fixtures
SERVERS = {"seaweedfs": "s3_server", "moto": "moto_server", "rclone": "rclone_server"}
BUCKET = "e2e"
IMAGE_PREFIX = "images/train/"
ODD_PREFIX = "odd/"


def _long_key() -> str:
    """About 1,000 bytes of UTF-8 (S3 allows 1,024), in segments of at most 255 bytes,
    as SeaweedFS stores keys as paths whose parts must fit a file name."""
    segment = "ünïcödé-" * 16 + "x"  # 129 characters, 193 bytes
    key = "/".join([f"long{i}-{segment}" for i in range(5)]) + "/end.bin"
    assert 950 <= len((ODD_PREFIX + key).encode()) <= 1024
    return key


LONG_KEY = _long_key()
EMPTY_KEY = "empty.bin"
#: keys under ``odd/`` that a signer, an URL encoder or a parser can get wrong
ODD_KEYS = (
    "space in name.bin",
    "plus+sign.bin",
    "100% sure.bin",
    "percent%2Fnot-a-slash.bin",
    "ünïcödé/日本語 ✓.bin",
    "tilde~quote'paren(star)*bang!.bin",
    "query?and#hash&eq=.bin",
    LONG_KEY,
    EMPTY_KEY,
)


@dataclass(frozen=True)
class ServerData:
    """What ``server_data`` uploaded to one server."""

    server: S3ServerProcess
    bucket: str
    #: ImageFolder files: (key relative to the image prefix, class, sha256 hex)
    images: list[tuple[str, str, str]]
    image_root: Path
    #: bodies of the odd objects, by key relative to ``odd/``
    odd: dict[str, bytes]

    @property
    def image_url(self) -> str:
        return f"s3://{self.bucket}/{IMAGE_PREFIX}"

    @property
    def odd_url(self) -> str:
        return f"s3://{self.bucket}/{ODD_PREFIX}"


@pytest.fixture(scope="session", params=list(SERVERS))
def any_server(request: pytest.FixtureRequest) -> S3ServerProcess:
    """Each local S3 server in turn (a test using it runs once per server)."""
    server: S3ServerProcess = request.getfixturevalue(SERVERS[request.param])
    return server


@pytest.fixture(scope="session")
def server_data(
    any_server: S3ServerProcess, image_folder: tuple[Path, list[tuple[str, str, str]]]
) -> ServerData:
    root, images = image_folder
    any_server.create_bucket(BUCKET)
    any_server.upload_dir(root, BUCKET, prefix=IMAGE_PREFIX)
    rng = random.Random(20261123)
    odd = {key: rng.randbytes(rng.randint(1, 5000)) for key in ODD_KEYS}
    odd[EMPTY_KEY] = b""
    for key, body in odd.items():
        any_server.put_object(BUCKET, ODD_PREFIX + key, body)
    return ServerData(any_server, BUCKET, images, root, odd)


@pytest.fixture
def server_env(
    aws_env: Callable[[S3ServerProcess], dict[str, str]], server_data: ServerData
) -> dict[str, str]:
    """AWS_* variables pointing at the server of ``server_data`` for this test."""
    return aws_env(server_data.server)


@pytest.fixture(scope="session")
def private_ca(tmp_path_factory: pytest.TempPathFactory) -> ServerCertificate:
    """A CA no trust store knows and a certificate it signed for 127.0.0.1 and localhost."""
    return make_private_ca(tmp_path_factory.mktemp("private_ca"))


def attempts_of(error: BaseException) -> int:
    """How many attempts the fetch client made before raising ``error`` (from its notes)."""
    for note in getattr(error, "__notes__", ()):
        if note.startswith("gave up after") and note.endswith("attempts"):
            return int(note.split()[3])
    return 1


def drop_traceback(info: pytest.ExceptionInfo[BaseException]) -> BaseException:
    """The error, without the traceback that keeps a loader's iterator (and workers) alive."""
    error = info.value
    error.__traceback__ = None
    return error


@pytest.fixture
def runtime_lease() -> Iterator[None]:
    """Keep this process's runtime open until the test ends.

    A listing over TLS releases the runtime as soon as it is done, and a runtime that
    closes while a TLS connection is still shutting down leaks it (see
    ``test_tls.py::test_runtime_waits_for_tls_connections_closing``): holding a lease
    moves the close to the end of the test, long after every shutdown finished.
    """
    runtime = acquire_runtime()
    try:
        yield
    finally:
        runtime.release()


def join_executor_threads(timeout: float = 10.0) -> None:
    """Wait for the threads of closed runtimes' default executors to end.

    A runtime closes without joining its loop's default executor (where aiobotocore
    builds its SSL contexts), so right after a listing such a thread may still be exiting,
    inside OpenSSL; a worker forked then can inherit OpenSSL's lock and hang for ever in
    its first ``ssl.create_default_context()``
    (``test_fork_after_listing.py::test_runtime_joins_its_executor_threads``). Tests call
    this before they fork workers, unless they hold the runtime open (``runtime_lease``):
    its executor's thread then waits for work, idle, and would not end.
    """
    for thread in threading.enumerate():
        if thread.name.startswith(("uvloop_", "asyncio_")):
            thread.join(timeout)


#: what tests made through :func:`closed_after_test`, closed when the test ends
_made: list[Any] = []


def closed_after_test(dataset: DatasetT) -> DatasetT:
    """``dataset``, closed when the test ends (an open dataset holds its process's runtime,
    whose threads the next test would find)."""
    _made.append(dataset)
    return dataset


@pytest.fixture(autouse=True)
def _close_what_tests_made() -> Iterator[None]:
    yield
    while _made:
        _made.pop().close()
