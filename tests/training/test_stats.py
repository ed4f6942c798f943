"""``loader.stats()``: counters that match what the server saw, merged over worker
processes, latency percentiles that match the latency the proxy added, a verdict that names
the actual bottleneck, and the periodic ``log_every_s`` line."""

from __future__ import annotations

import hashlib
import logging
import time

import pytest

from concurrent_loader import ConcurrentDataLoader, FetchConfig, ObjectDataset
from concurrent_loader.stores import S3Config

PERCENTILES = {"p50", "p95", "p99"}


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def hashed_dataset(
    image_dataset, n: int | None = None, *, endpoint_url: str | None = None, **kwargs
) -> ObjectDataset:
    keys = [key for key, _, _ in image_dataset.files][:n]
    root = S3Config.from_url(image_dataset.s3_url, endpoint_url=endpoint_url)
    return ObjectDataset(root, keys, decode=sha256_hex, **kwargs)


def object_bytes(image_dataset, n: int | None = None) -> int:
    keys = [key for key, _, _ in image_dataset.files][:n]
    return sum((image_dataset.local_root / key).stat().st_size for key in keys)


def check_shape(stats: dict) -> None:
    for name in (
        "requests",
        "bytes",
        "retries",
        "throttles",
        "inflight",
        "skipped",
        "batches",
    ):
        assert isinstance(stats[name], int), name
    for name in ("get_latency_s", "first_byte_s", "wait_s_per_batch"):
        assert set(stats[name]) == PERCENTILES, name
        p50, p95, p99 = (stats[name][q] for q in ("p50", "p95", "p99"))
        if name == "first_byte_s" and p50 is None:
            # Local files have no first byte to time.
            assert p95 is None and p99 is None, stats[name]
            continue
        assert 0 <= p50 <= p95 <= p99, (name, stats[name])
    for name in ("decode_s_per_image", "bytes_per_s", "images_per_s"):
        assert isinstance(stats[name], float) and stats[name] >= 0, name
    assert isinstance(stats["verdict"], str) and "\n" not in stats["verdict"]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_counts_match_what_the_server_saw(image_dataset, s3_env, proxy_factory, num_workers):
    proxy = proxy_factory()  # no faults: every object is fetched exactly once
    ds = hashed_dataset(image_dataset, endpoint_url=proxy.endpoint_url)
    loader = ConcurrentDataLoader(ds, batch_size=5, num_workers=num_workers)
    before = loader.stats()
    assert before["requests"] == before["bytes"] == before["batches"] == 0
    proxy.reset_stats()

    batches = list(loader)
    seen = proxy.stats()
    stats = loader.stats()
    check_shape(stats)
    assert sum(len(b) for b in batches) == len(ds)
    assert seen["requests_by_method"] == {"GET": len(ds)}
    assert seen["responses_by_status"] == {"200": len(ds)}
    # Counted in every worker, merged in the main process.
    assert stats["requests"] == seen["requests"] == len(ds)
    assert stats["bytes"] == object_bytes(image_dataset)
    assert seen["bytes_sent"] > stats["bytes"]  # the proxy's count includes headers
    assert stats["retries"] == stats["throttles"] == stats["skipped"] == 0
    assert stats["inflight"] == 0
    assert stats["batches"] == len(batches) == len(loader)
    assert stats["images_per_s"] > 0 and stats["bytes_per_s"] > 0
    assert stats["decode_s_per_image"] > 0

    # A second epoch adds to the same counters.
    list(loader)
    again = loader.stats()
    assert again["requests"] == 2 * len(ds) == proxy.stats()["requests"]
    assert again["bytes"] == 2 * stats["bytes"]
    assert again["batches"] == 2 * len(batches)


def test_verdict_is_training_step_when_the_consumer_is_slow(image_dataset, s3_env):
    ds = hashed_dataset(image_dataset, fetch_config=FetchConfig(max_inflight_requests=16))
    loader = ConcurrentDataLoader(ds, batch_size=8)
    for _ in loader:
        time.sleep(1.0)  # a "training step" far slower than loading 8 small objects
    stats = loader.stats()
    check_shape(stats)
    assert stats["verdict"].startswith("training step"), stats["verdict"]
    assert stats["batches"] == 3
    # The waits were the loader's start-up, then (almost) nothing.
    assert stats["wait_s_per_batch"]["p50"] < 0.1


def test_verdict_is_storage_when_gets_are_slow_and_serialised(image_dataset, s3_env, proxy_factory):
    proxy = proxy_factory(latency_ms=300)
    serialised = FetchConfig(max_inflight_requests=1)
    ds = hashed_dataset(image_dataset, 8, endpoint_url=proxy.endpoint_url, fetch_config=serialised)
    loader = ConcurrentDataLoader(ds, batch_size=2)
    assert sum(len(b) for b in loader) == 8
    stats = loader.stats()
    check_shape(stats)
    assert stats["verdict"].startswith("storage"), stats["verdict"]
    assert stats["requests"] == 8
    # Percentiles are bucket upper edges (buckets about 26 % wide) of the real latency.
    assert 0.3 <= stats["get_latency_s"]["p50"] <= 0.3 * 1.26 * 1.5
    # The proxy holds the first byte: time to first byte carries the latency, and is never
    # more than the whole GET.
    assert 0.3 <= stats["first_byte_s"]["p50"] <= stats["get_latency_s"]["p50"]
    # One GET at a time: each batch of 2 took at least two round trips to arrive.
    assert stats["wait_s_per_batch"]["p50"] >= 0.5


def test_verdict_is_decode_when_decoding_is_slow(image_dataset):
    def slow_decode(data: bytes) -> int:
        time.sleep(0.08)
        return len(data)

    keys = [key for key, _, _ in image_dataset.files][:8]
    ds = ObjectDataset(image_dataset.local_root, keys, decode=slow_decode)
    loader = ConcurrentDataLoader(ds, batch_size=2, decode_threads=1)
    assert sum(len(b) for b in loader) == 8
    stats = loader.stats()
    check_shape(stats)
    assert stats["verdict"].startswith("decode"), stats["verdict"]
    assert stats["decode_s_per_image"] >= 0.08


@pytest.mark.parametrize("log_every_s", [None, 0.0])
def test_log_every_s_logs_a_stats_line(image_dataset, s3_env, caplog, log_every_s):
    ds = hashed_dataset(image_dataset)
    loader = ConcurrentDataLoader(ds, batch_size=4, log_every_s=log_every_s)
    with caplog.at_level(logging.INFO, logger="concurrent_loader"):
        batches = list(loader)
    lines = [
        r.getMessage()
        for r in caplog.records
        if r.name.startswith("concurrent_loader") and r.levelno == logging.INFO
    ]
    if log_every_s is None:
        assert lines == []  # off by default
    else:
        # Every batch is past a 0 s period: one line each, with the verdict.
        assert len(lines) == len(batches)
        assert all("img/s" in line and " - " in line for line in lines)
        assert any(v in lines[-1] for v in ("training step", "storage", "decode"))
