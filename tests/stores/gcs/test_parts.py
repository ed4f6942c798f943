"""A GCS object read in parts is of one version: one overwritten while its parts are read
(the fault proxy's latency spreads them over time) is read again, whole, and the reader gets
the new version, never a mix (each part's ETag names the object's version)."""

from __future__ import annotations

import asyncio
import random

from concurrent_loader import FetchConfig, RetryConfig
from concurrent_loader.fetch.client import FetchClient
from concurrent_loader.fetch.parts import PartsConfig, read_in_parts

KEY = "changing.bin"
SIZE = 300_000
LATENCY_S = 0.6


def test_an_object_overwritten_during_a_read_in_parts_is_read_again(
    gcs_server, gcs_bucket, gcs_proxy
):
    rng = random.Random(5)
    old, new = rng.randbytes(SIZE), rng.randbytes(SIZE)
    gcs_server.put_object(gcs_bucket, "parts/" + KEY, old)
    proxy = gcs_proxy(latency_ms=LATENCY_S * 1000)
    config = gcs_server.store_config(gcs_bucket, "parts", endpoint_url=proxy.endpoint_url)
    fetch = FetchConfig(retry=RetryConfig(max_attempts=3, base_delay=0.01, max_delay=0.05))
    # Three parts, one at a time: GETs sent at about 0, 0.6 and 1.2 s; the object is
    # overwritten at about 0.9 s, between the second part's GET and the third's.
    parts = PartsConfig(part_size=SIZE // 3 + 1, parts_in_flight=1)

    async def read_while_overwritten() -> bytearray:
        client = FetchClient(config.open(fetch), fetch)
        try:
            reading = asyncio.ensure_future(read_in_parts(client, KEY, None, SIZE, parts))
            await asyncio.sleep(1.5 * LATENCY_S)
            await asyncio.to_thread(gcs_server.put_object, gcs_bucket, "parts/" + KEY, new)
            return await reading
        finally:
            await client.close()

    got = asyncio.run(read_while_overwritten())
    assert bytes(got) == new, "the read mixed two versions of the object"
