"""Large reads as ranged GETs in flight (``fetch/parts.py``), on the in-memory store.

The store is wrapped to record the byte range of every GET it is asked, so the tests check
which parts were requested and in what order, and its own record of GETs in flight gives the
concurrency. Retries do not sleep (``base_delay=0``) and hedging is off, so the GETs counted
are exactly the parts (and retries) asked for.
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
from collections.abc import AsyncIterator
from typing import Any

import pytest

from concurrent_loader import ConcurrentDataLoader, ObjectDataset
from concurrent_loader.config import FetchConfig, HedgeConfig, RetryConfig
from concurrent_loader.errors import (
    AccessDenied,
    BadRequest,
    ConfigError,
    IncompleteBody,
    Reason,
    ServerError,
)
from concurrent_loader.fetch import FetchClient
from concurrent_loader.fetch.parts import PartsConfig, read_in_parts, split
from concurrent_loader.pipeline import BatchPipeline, PipelineOptions
from concurrent_loader.stores import ByteRange, S3Config
from concurrent_loader.stores.base import Body, ObjectInfo
from concurrent_loader.testing.memory import MemoryConfig

KEY = "shard-000.tar"
CONFIG = FetchConfig(retry=RetryConfig(base_delay=0.0), hedge=HedgeConfig(enabled=False))


def payload(size: int, seed: int = 0) -> bytes:
    return random.Random(seed).randbytes(size)


class RecordingStore:
    """A store that records the range of each GET before passing it on."""

    def __init__(self, config: MemoryConfig) -> None:
        self.inner = config.open(CONFIG)
        self.capabilities = self.inner.capabilities
        self.ranges: list[ByteRange | None] = []

    def url_for(self, key: str) -> str:
        return self.inner.url_for(key)

    async def get(self, key: str, byte_range: ByteRange | None = None) -> Body:
        self.ranges.append(byte_range)
        return await self.inner.get(key, byte_range)

    def list(self) -> AsyncIterator[ObjectInfo]:
        return self.inner.list()

    async def close(self) -> None:
        await self.inner.close()


def read(
    config: MemoryConfig,
    parts: PartsConfig,
    *,
    size: int,
    byte_range: ByteRange | None = None,
) -> tuple[bytes | bytearray, RecordingStore]:
    store = RecordingStore(config)

    async def go() -> bytes | bytearray:
        client = FetchClient(store, CONFIG)  # type: ignore[arg-type]
        try:
            return await read_in_parts(client, KEY, byte_range, size, parts)
        finally:
            await client.close()

    return asyncio.run(go()), store


def test_split_covers_the_span_in_order():
    parts = split(ByteRange(5, 40), 10)
    assert [(p.start, p.end) for p in parts] == [(5, 15), (15, 25), (25, 35), (35, 40)]


@pytest.mark.parametrize(
    ("size", "part_size", "in_flight"), [(1000, 100, 4), (1001, 64, 3), (999, 500, 8)]
)
def test_a_whole_object_is_assembled_in_order_with_bounded_parts_in_flight(
    size, part_size, in_flight
):
    data = payload(size)
    config = MemoryConfig({KEY: data}, latency_s=0.002)
    got, store = read(config, PartsConfig(part_size, in_flight), size=size)
    assert bytes(got) == data
    parts = [r for r in store.ranges if r is not None and r.end <= size]
    assert parts == split(ByteRange(0, size), part_size)  # each part once, in byte order
    # Plus the one-byte check that the object did not grow.
    assert store.ranges.count(ByteRange(size, size + 1)) == 1
    assert len(store.ranges) == len(parts) + 1
    assert 1 < config.stats.max_in_flight <= in_flight + 1
    assert config.stats.in_flight == 0


def test_a_byte_range_is_read_in_parts_without_the_growth_check():
    data = payload(5000)
    got, store = read(
        MemoryConfig({KEY: data}), PartsConfig(700, 2), size=3000, byte_range=ByteRange(1234, 4234)
    )
    assert bytes(got) == data[1234:4234]
    assert store.ranges == split(ByteRange(1234, 4234), 700)


def test_a_part_that_fails_transiently_is_fetched_again_alone():
    data = payload(1000)

    def script(key: str, attempt: int) -> Any:
        return ServerError("boom", cause=Reason.SERVER_ERROR) if attempt == 2 else None

    got, store = read(MemoryConfig({KEY: data}, script=script), PartsConfig(100, 1), size=1000)
    assert bytes(got) == data
    expected = split(ByteRange(0, 1000), 100)
    # Part 3 asked twice (the failed attempt, then its retry), every other part once.
    assert [r for r in store.ranges if r is not None and r.end <= 1000] == [
        *expected[:2],
        expected[2],
        *expected[2:],
    ]


def test_a_part_that_fails_for_good_fails_the_read_naming_object_and_bytes():
    data = payload(1000)

    def script(key: str, attempt: int) -> Any:
        if attempt == 3:
            return AccessDenied("HTTP 403 AccessDenied", cause=Reason.ACCESS_DENIED, status=403)
        return 0.05  # the other parts are still in flight when it fails

    config = MemoryConfig({KEY: data}, script=script)
    with pytest.raises(AccessDenied) as caught:
        read(config, PartsConfig(100, 4), size=1000)
    error = caught.value
    assert error.cause == Reason.ACCESS_DENIED and error.status == 403
    assert error.url == f"memory://test/{KEY}"
    assert f"memory://test/{KEY}" in str(error)
    assert "bytes 300-399 (part 4 of 10 of the read of bytes 0-999)" in str(error)
    # Failed at once: the rest were cancelled, not fetched.
    assert config.stats.total < 10
    assert config.stats.in_flight == 0


def test_an_object_that_grew_since_listing_is_read_again_whole():
    data = payload(1500)
    got, store = read(MemoryConfig({KEY: data}), PartsConfig(100, 4), size=1000)
    assert bytes(got) == data
    assert store.ranges[-1] is None  # the plain GET after the check found byte 1000


def test_an_object_that_shrank_fails_naming_the_missing_bytes():
    with pytest.raises(IncompleteBody, match="bytes 900-999"):
        read(MemoryConfig({KEY: payload(950)}), PartsConfig(100, 4), size=1000)


@pytest.mark.parametrize(
    "kwargs",
    [{"part_size": 0}, {"parts_in_flight": 0}, {"part_size": 1.5}, {"parts_in_flight": True}],
)
def test_bad_settings_are_config_errors(kwargs):
    with pytest.raises(ConfigError):
        PartsConfig(**kwargs)


def test_only_reads_larger_than_a_part_go_in_parts():
    parts = PartsConfig(part_size=100)
    assert not parts.applies(None)
    assert not parts.applies(100)
    assert parts.applies(101)
    assert not PartsConfig(part_size=100, enabled=False).applies(10_000)


@pytest.mark.parametrize(
    ("parts", "gets"), [(PartsConfig(256, 3), 4 + 1), (PartsConfig(enabled=False), 1)]
)
def test_the_pipeline_reads_a_large_listed_object_in_parts(parts, gets):
    objects = {"big.bin": payload(1000, seed=1), "small.bin": payload(200, seed=2)}
    config = MemoryConfig(objects)
    dataset = ObjectDataset(config, fetch_config=CONFIG)
    pipeline = BatchPipeline(
        dataset, [[0, 1]], collate_fn=list, options=PipelineOptions(parts=parts)
    )
    [batch] = list(pipeline)
    keys = [dataset.source.keys[i] for i in range(2)]
    assert [bytes(b) for b in batch] == [objects[k] for k in keys]
    assert config.stats.gets["big.bin"] == gets
    assert config.stats.gets["small.bin"] == 1


def test_the_datasets_parts_argument_reaches_its_pipeline():
    objects = {"big.bin": payload(1000, seed=1)}
    config = MemoryConfig(objects)
    dataset = ObjectDataset(config, fetch_config=CONFIG, parts=PartsConfig(256, 3))
    assert dataset.parts == PartsConfig(256, 3)
    loader = ConcurrentDataLoader(dataset, batch_size=None)
    assert [bytes(b) for b in loader] == [objects["big.bin"]]
    assert config.stats.gets["big.bin"] == 4 + 1  # four parts and the growth check


def test_the_parts_in_flight_count_against_the_byte_budget():
    """Two objects of 1000 bytes in parts of 100, 3 in flight: each reserves 1000 + 300. A
    budget of 2200 would admit both reads at once on their sizes alone; with the parts
    counted, one waits for the other, so at most 3 parts (+ the growth check) are in flight."""
    objects = {"a.bin": payload(1000, seed=1), "b.bin": payload(1000, seed=2)}
    config = MemoryConfig(objects, latency_s=0.002)
    parts = PartsConfig(100, 3)
    assert parts.reservation(1000) == 1300
    fetch_config = dataclasses.replace(CONFIG, max_inflight_bytes=2200)
    dataset = ObjectDataset(config, fetch_config=fetch_config)
    options = PipelineOptions(parts=parts)
    [batch] = list(BatchPipeline(dataset, [[0, 1]], collate_fn=list, options=options))
    assert sorted(bytes(b) for b in batch) == sorted(objects.values())
    assert config.stats.max_in_flight <= 3 + 1


# ---------------------------------------------------------------- against the real S3 server


@pytest.fixture()
def large_objects(s3_server, s3_bucket):
    """Two objects under ``parts/``: one of 2 MiB + 123 bytes (9 parts of 256 KiB) and a
    small one (one GET)."""
    objects = {
        "parts/big.bin": payload(2 * 1024 * 1024 + 123, seed=7),
        "parts/small.bin": b"x" * 100,
    }
    for key, data in objects.items():
        s3_server.put_object(s3_bucket, key, data)
    return objects


def test_against_the_real_server_through_faults(large_objects, s3_bucket, s3_env, proxy_factory):
    """Parts of a large object over HTTP, with resets and 500s injected by the proxy: the
    assembled bytes are the object's, each part is a 206, and the server answers the
    growth check with 416."""
    from concurrent_loader.testing.proxy import FaultPlan

    proxy = proxy_factory(faults=FaultPlan(seed=3, error_500=0.15, reset_mid_body=0.1))
    dataset = ObjectDataset(
        S3Config.from_url(f"s3://{s3_bucket}/parts/", endpoint_url=proxy.endpoint_url),
        fetch_config=CONFIG,
    )
    options = PipelineOptions(parts=PartsConfig(256 * 1024, 4))
    [batch] = list(BatchPipeline(dataset, [[0, 1]], collate_fn=list, options=options))
    keys = [f"parts/{dataset.source.keys[i]}" for i in range(2)]
    assert [bytes(b) for b in batch] == [large_objects[k] for k in keys]
    stats = proxy.stats()
    statuses = stats["responses_by_status"]
    # Each of the 9 parts answered 206 at least once (more where a reset cut a body short).
    assert statuses.get("206", 0) >= 9
    assert statuses.get("416") == 1  # the growth check: no byte past the listed size
    assert sum(stats["faults"].values()) > 0  # the premise: faults were injected and retried


def test_an_object_rewritten_after_listing_is_read_as_it_is_now(s3_server, s3_bucket, s3_env):
    """Sizes come from the listing; an object rewritten since is never returned cut short
    or padded: a larger one is read again whole, a smaller one fails naming the bytes."""
    s3_server.put_object(s3_bucket, "rewritten/grows.bin", payload(600_000, seed=1))
    s3_server.put_object(s3_bucket, "rewritten/shrinks.bin", payload(600_000, seed=2))
    dataset = ObjectDataset(f"s3://{s3_bucket}/rewritten/", fetch_config=CONFIG)
    grown = payload(700_000, seed=3)
    s3_server.put_object(s3_bucket, "rewritten/grows.bin", grown)
    # Cut at a part boundary, so exactly one part (the last) is missing: a 416.
    s3_server.put_object(s3_bucket, "rewritten/shrinks.bin", payload(4 * 128 * 1024, seed=4))
    options = PipelineOptions(parts=PartsConfig(128 * 1024, 4))
    keys = [dataset.source.keys[i] for i in range(2)]
    grows, shrinks = keys.index("grows.bin"), keys.index("shrinks.bin")
    [batch] = list(BatchPipeline(dataset, [[grows]], collate_fn=list, options=options))
    assert bytes(batch[0]) == grown
    with pytest.raises(BadRequest) as caught:
        list(BatchPipeline(dataset, [[shrinks]], collate_fn=list, options=options))
    assert f"s3://{s3_bucket}/rewritten/shrinks.bin" in str(caught.value)
    assert caught.value.status == 416
    assert "bytes 524288-599999 (part 5 of 5 of the read of bytes 0-599999)" in str(caught.value)
