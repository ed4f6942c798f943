"""A read in parts is of one version of the object: an object overwritten while its parts
are read (the fault proxy's latency spreads the parts over time) is read again, whole, and
the loader gets the new version, never a mix of the two."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from typing import Any

from concurrent_loader import FetchConfig, RetryConfig
from concurrent_loader.fetch.client import FetchClient
from concurrent_loader.fetch.parts import PartsConfig, read_in_parts
from concurrent_loader.stores.s3 import S3Config
from concurrent_loader.testing import LocalS3Server

BUCKET = "integrity-parts"
KEY = "changing.bin"
SIZE = 300_000
LATENCY_S = 0.6


def test_an_object_overwritten_during_a_read_in_parts_is_read_again(
    s3_server: LocalS3Server, proxy_factory: Callable[..., Any]
) -> None:
    s3_server.create_bucket(BUCKET)
    rng = random.Random(5)
    old, new = rng.randbytes(SIZE), rng.randbytes(SIZE)
    s3_server.put_object(BUCKET, KEY, old)
    proxy = proxy_factory(latency_ms=LATENCY_S * 1000)
    config = S3Config.from_url(
        f"s3://{BUCKET}/",
        endpoint_url=proxy.endpoint_url,
        region=s3_server.region,
        aws_access_key_id=s3_server.access_key,
        aws_secret_access_key=s3_server.secret_key,
    ).resolved()
    fetch = FetchConfig(retry=RetryConfig(max_attempts=3, base_delay=0.01, max_delay=0.05))
    # Three parts, one at a time: GETs sent at about 0, 0.6 and 1.2 s; the object is
    # overwritten at about 0.9 s, between the second part's GET and the third's.
    parts = PartsConfig(part_size=SIZE // 3 + 1, parts_in_flight=1)

    uploader = s3_server.client()  # made beforehand: making one takes a while

    async def read_while_overwritten() -> bytearray:
        client = FetchClient(config.open(fetch), fetch)
        try:
            reading = asyncio.ensure_future(read_in_parts(client, KEY, None, SIZE, parts))
            await asyncio.sleep(1.5 * LATENCY_S)
            await asyncio.to_thread(uploader.put_object, Bucket=BUCKET, Key=KEY, Body=new)
            return await reading
        finally:
            await client.close()

    try:
        got = asyncio.run(read_while_overwritten())
    finally:
        uploader.close()
    assert bytes(got) == new, "the read mixed two versions of the object"
    # The first read's three parts and its probe past the end, then a second read.
    assert proxy.stats()["requests_by_method"]["GET"] > 4


def test_an_object_read_in_parts_from_rclone_and_corrupted_is_never_returned(
    rclone_server: Any, proxy_factory: Callable[..., Any]
) -> None:
    """``rclone serve s3`` answers ranged GETs with 200s carrying the whole object's CRC32
    (kept for the assembled read, never checked against one part): a body corrupted on its
    way (every GET, here) is never returned, whichever way the read ends."""
    from concurrent_loader import ObjectDataset
    from concurrent_loader.errors import IntegrityError
    from concurrent_loader.testing import FaultPlan

    rclone_server.create_bucket(BUCKET)
    rclone_server.put_object(BUCKET, "parts.bin", random.Random(7).randbytes(SIZE))
    proxy = proxy_factory(rclone_server.endpoint_url, faults=FaultPlan(corrupt=1.0))
    root = rclone_server.store_config(BUCKET, "", endpoint_url=proxy.endpoint_url)
    fetch = FetchConfig(retry=RetryConfig(max_attempts=2, base_delay=0.01, max_delay=0.05))
    parts = PartsConfig(part_size=SIZE // 3 + 1, parts_in_flight=3)
    with ObjectDataset(root, ["parts.bin"], fetch_config=fetch, parts=parts) as ds:
        try:
            ds[0]
        except IntegrityError as error:
            assert error.url == f"s3://{BUCKET}/parts.bin"
        else:
            raise AssertionError("corrupted parts were returned")
