"""How a ranged GET's answer is taken, against real servers: rclone's ``200`` holding exactly
the range (with the whole object's checksum in its headers) reads right in parts, checksums
on; a ``200`` holding the whole object (the proxy drops the ``Range`` header on its way up,
``ignore_range``) is refused at once from its head, naming the object, and not retried
(``tests/transport`` shows such a body is never read)."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from typing import Any

import pytest

from concurrent_loader import FetchConfig, RetryConfig
from concurrent_loader.errors import BadRequest, Reason
from concurrent_loader.fetch.client import FetchClient
from concurrent_loader.fetch.parts import PartsConfig, read_in_parts
from concurrent_loader.stores.base import ByteRange
from concurrent_loader.stores.s3 import S3Config
from concurrent_loader.testing import FaultPlan, LocalS3Server, RcloneS3Server, S3ServerProcess

from .conftest import attempts_of

BUCKET = "range-answers"
SIZE = 300_000
DATA = random.Random(11).randbytes(SIZE)


def _config(server: S3ServerProcess, endpoint_url: str, **options: Any) -> S3Config:
    return S3Config.from_url(
        f"s3://{BUCKET}/",
        endpoint_url=endpoint_url,
        region=server.region,
        aws_access_key_id=server.access_key,
        aws_secret_access_key=server.secret_key,
        **options,
    ).resolved()


def _read_in_parts(config: S3Config, key: str, byte_range: ByteRange | None) -> bytes:
    fetch = FetchConfig(retry=RetryConfig(max_attempts=3, base_delay=0.01, max_delay=0.05))
    parts = PartsConfig(part_size=SIZE // 3 + 1, parts_in_flight=3)
    size = byte_range.length if byte_range is not None else SIZE

    async def read() -> bytes:
        client = FetchClient(config.open(fetch), fetch)
        try:
            return bytes(await read_in_parts(client, key, byte_range, size, parts))
        finally:
            await client.close()

    return asyncio.run(read())


@pytest.mark.parametrize("etag_md5", [False, True])
def test_rclones_200_for_a_range_reads_right_in_parts_with_checksums_on(
    rclone_server: RcloneS3Server, aws_env: Callable[..., Any], etag_md5: bool
) -> None:
    aws_env(rclone_server)
    rclone_server.create_bucket(BUCKET)
    # Uploaded by boto3, which adds a CRC32: rclone keeps it and sends it with every answer,
    # a range's too, where it is not the body's.
    rclone_server.put_object(BUCKET, "whole.bin", DATA)
    config = _config(rclone_server, rclone_server.endpoint_url, verify_etag_md5=etag_md5)
    assert _read_in_parts(config, "whole.bin", None) == DATA
    span = ByteRange(1000, SIZE - 1000)
    assert _read_in_parts(config, "whole.bin", span) == DATA[span.start : span.end]


def test_a_whole_object_for_a_range_is_refused_naming_the_object(
    s3_server: LocalS3Server, aws_env: Callable[..., Any], proxy_factory: Callable[..., Any]
) -> None:
    aws_env(s3_server)
    s3_server.create_bucket(BUCKET)
    s3_server.put_object(BUCKET, "ignored.bin", DATA)
    proxy = proxy_factory(faults=FaultPlan(ignore_range=1.0))
    config = _config(s3_server, proxy.endpoint_url)
    # Without a range the same object reads whole through the same proxy.
    fetch = FetchConfig()

    async def whole() -> bytes:
        client = FetchClient(config.open(fetch), fetch)
        try:
            return bytes(await client.get("ignored.bin"))
        finally:
            await client.close()

    assert asyncio.run(whole()) == DATA
    with pytest.raises(BadRequest) as info:
        _read_in_parts(config, "ignored.bin", ByteRange(10, SIZE // 2))
    error = info.value
    assert error.url == f"s3://{BUCKET}/ignored.bin"
    assert (error.cause, error.status) == (Reason.BAD_REQUEST, 200)
    assert "ignored the range" in str(error)
    assert attempts_of(error) == 1  # not retried: the server would ignore it again
    assert proxy.stats()["faults"]["ignore_range"] >= 2
