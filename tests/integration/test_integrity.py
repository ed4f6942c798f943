"""Which checksums the local S3 servers return, and that the store checks them: a body
corrupted on its way (the fault proxy inverts one byte, keeping the length) is fetched
again, or ends in ``IntegrityError`` naming the object, the algorithm, the expected and the
computed value; never returned.

Runs against both servers (``any_server``). Objects are uploaded with boto3's default
checksum (CRC32 since botocore's "when_supported" default), with SHA-1 and SHA-256, and
with none at all (``request_checksum_calculation="when_required"``).
"""

from __future__ import annotations

import base64
import hashlib
import random
import zlib
from collections.abc import Callable
from dataclasses import dataclass

import pytest

from concurrent_loader import FetchConfig, ObjectDataset, RetryConfig
from concurrent_loader.errors import IntegrityError, Reason
from concurrent_loader.stores import S3Config
from concurrent_loader.testing import FaultPlan, S3ServerProcess

from .conftest import attempts_of, closed_after_test

BUCKET = "integrity"
#: upload setting -> (the header S3 returns, the digest of a body in it); None: no checksum
UPLOADS: dict[str, tuple[str, Callable[[bytes], bytes]] | None] = {
    "default": ("x-amz-checksum-crc32", lambda data: zlib.crc32(data).to_bytes(4, "big")),
    "SHA1": ("x-amz-checksum-sha1", lambda data: hashlib.sha1(data).digest()),
    "SHA256": ("x-amz-checksum-sha256", lambda data: hashlib.sha256(data).digest()),
    "none": None,
}
CHECKED = [name for name, header in UPLOADS.items() if header is not None]
RETRY = FetchConfig(retry=RetryConfig(max_attempts=3, base_delay=0.01, max_delay=0.05))


@dataclass(frozen=True)
class Uploaded:
    server: S3ServerProcess
    #: body by upload setting (the object's key is ``<setting>.bin``)
    bodies: dict[str, bytes]

    def dataset(
        self,
        upload: str,
        endpoint_url: str,
        fetch_config: FetchConfig | None = None,
        verify_etag_md5: bool = False,
    ) -> ObjectDataset:
        root = S3Config.from_url(
            f"s3://{BUCKET}/", endpoint_url=endpoint_url, verify_etag_md5=verify_etag_md5
        )
        dataset = ObjectDataset(root, [f"{upload}.bin"], fetch_config=fetch_config)
        return closed_after_test(dataset)


@pytest.fixture(scope="session")
def uploaded(any_server: S3ServerProcess) -> Uploaded:
    any_server.create_bucket(BUCKET)
    rng = random.Random(20261127)
    bodies = {name: rng.randbytes(110_000) for name in UPLOADS}
    client = any_server.client()
    bare = any_server.client(request_checksum_calculation="when_required")
    try:
        for name, body in bodies.items():
            key = f"{name}.bin"
            if name == "none":
                bare.put_object(Bucket=BUCKET, Key=key, Body=body)
            elif name == "default":
                client.put_object(Bucket=BUCKET, Key=key, Body=body)
            else:
                client.put_object(Bucket=BUCKET, Key=key, Body=body, ChecksumAlgorithm=name)
    finally:
        client.close()
        bare.close()
    return Uploaded(any_server, bodies)


@pytest.fixture
def env(aws_env: Callable[[S3ServerProcess], dict[str, str]], uploaded: Uploaded) -> None:
    aws_env(uploaded.server)


@pytest.mark.parametrize("upload", list(UPLOADS))
def test_the_server_returns_the_full_object_checksum(uploaded: Uploaded, upload: str) -> None:
    """What the tests below rely on: a GET asking for checksums gets the upload's."""
    client = uploaded.server.client()
    try:
        response = client.get_object(Bucket=BUCKET, Key=f"{upload}.bin", ChecksumMode="ENABLED")
    finally:
        client.close()
    headers = response["ResponseMetadata"]["HTTPHeaders"]
    returned = {name for name in headers if name.startswith("x-amz-checksum-")}
    expected = UPLOADS[upload]
    if expected is None:
        assert returned == set()
    else:
        header, digest = expected
        assert headers[header] == base64.b64encode(digest(uploaded.bodies[upload])).decode()


@pytest.mark.parametrize("upload", list(UPLOADS))
def test_every_object_loads_through_a_clean_proxy(
    uploaded: Uploaded, env: None, proxy_factory: Callable[..., object], upload: str
) -> None:
    proxy = proxy_factory(uploaded.server.endpoint_url)
    ds = uploaded.dataset(upload, proxy.endpoint_url)  # type: ignore[attr-defined]
    assert ds[0] == uploaded.bodies[upload]


@pytest.mark.parametrize("upload", CHECKED)
def test_a_body_corrupted_every_time_ends_in_integrity_error(
    uploaded: Uploaded, env: None, proxy_factory: Callable[..., object], upload: str
) -> None:
    proxy = proxy_factory(uploaded.server.endpoint_url, faults=FaultPlan(corrupt=1.0))
    ds = uploaded.dataset(upload, proxy.endpoint_url, fetch_config=RETRY)  # type: ignore[attr-defined]
    with pytest.raises(IntegrityError) as caught:
        ds[0]
    error = caught.value
    header, digest = UPLOADS[upload]  # type: ignore[misc]
    body = uploaded.bodies[upload]
    corrupted = bytearray(body)
    corrupted[len(body) // 2] ^= 0xFF
    text = str(error)
    assert error.cause == Reason.CHECKSUM_MISMATCH
    assert error.url == f"s3://{BUCKET}/{upload}.bin" and error.url in text
    assert header.removeprefix("x-amz-checksum-") in text
    assert base64.b64encode(digest(body)).decode() in text
    assert base64.b64encode(digest(bytes(corrupted))).decode() in text
    assert attempts_of(error) == RETRY.retry.max_attempts
    assert proxy.stats()["faults"]["corrupt"] == RETRY.retry.max_attempts  # type: ignore[attr-defined]


def _seed_corrupting_only_the_first_get(target: str) -> int:
    """A seed whose plan corrupts the first GET of ``target`` and not the second."""
    for seed in range(10_000):
        plan = FaultPlan(seed=seed, corrupt=0.5)
        if (
            plan.fault_for("GET", target, 0) == "corrupt"
            and plan.fault_for("GET", target, 1) is None
        ):
            return seed
    raise AssertionError("no such seed")


@pytest.mark.parametrize("upload", CHECKED)
def test_a_corrupted_body_is_fetched_again(
    uploaded: Uploaded, env: None, proxy_factory: Callable[..., object], upload: str
) -> None:
    seed = _seed_corrupting_only_the_first_get(f"/{BUCKET}/{upload}.bin")
    plan = FaultPlan(seed=seed, corrupt=0.5)
    proxy = proxy_factory(uploaded.server.endpoint_url, faults=plan)
    ds = uploaded.dataset(upload, proxy.endpoint_url, fetch_config=RETRY)  # type: ignore[attr-defined]
    assert ds[0] == uploaded.bodies[upload]
    stats = proxy.stats()  # type: ignore[attr-defined]
    assert stats["faults"]["corrupt"] == 1
    assert stats["requests_by_method"]["GET"] == 2


def test_an_object_without_checksum_is_checked_by_its_etag_when_asked(
    uploaded: Uploaded, env: None, proxy_factory: Callable[..., object]
) -> None:
    proxy = proxy_factory(uploaded.server.endpoint_url, faults=FaultPlan(corrupt=1.0))
    ds = uploaded.dataset(
        "none",
        proxy.endpoint_url,  # type: ignore[attr-defined]
        fetch_config=RETRY,
        verify_etag_md5=True,
    )
    with pytest.raises(IntegrityError, match="md5") as caught:
        ds[0]
    assert hashlib.md5(uploaded.bodies["none"]).hexdigest() in str(caught.value)
    assert caught.value.url == f"s3://{BUCKET}/none.bin"
