"""The pipeline's coalescing hook, on the in-memory store (our own logic only): merged reads
stay within the byte budget and deliver every sample in order; a failure while planning a
batch fails that batch instead of leaving it unfinished."""

from __future__ import annotations

import pytest

from concurrent_loader import Coalescing, ShardDataset
from concurrent_loader.pipeline import BatchPipeline, PipelineOptions
from concurrent_loader.stores import MemoryConfig
from concurrent_loader.stores.memory import MemoryStore


def memory_shards(packed) -> MemoryConfig:
    objects = {p.name: p.read_bytes() for p in packed.local.iterdir()}
    return MemoryConfig(objects, name="shards")


def keys(batches) -> list[list[str]]:
    return [list(batch["__key__"]) for batch in batches]


def test_merged_reads_stay_within_the_byte_budget(packed, monkeypatch):
    ranges: list[int] = []
    read = MemoryStore._read

    def recording(self, key, byte_range):
        if byte_range is not None and not key.endswith(".idx"):
            ranges.append(byte_range.length)
        return read(self, key, byte_range)

    monkeypatch.setattr(MemoryStore, "_read", recording)
    ds = ShardDataset(memory_shards(packed), coalescing=Coalescing(max_gap=1 << 20))
    batches = [list(range(i, min(i + 32, len(ds)))) for i in range(0, len(ds), 32)]
    budget = 20_000  # about four samples' spans; a batch of 32 adjacent ones is ~140 KB
    pipeline = BatchPipeline(
        ds,
        batches,
        collate_fn=lambda items: {"__key__": [s["__key__"] for s in items]},
        options=PipelineOptions(max_inflight_bytes=budget, prefetch_batches=3),
    )
    got = keys(pipeline)
    assert got == [[packed.order[i] for i in b] for b in batches]
    assert max(ranges) <= budget
    assert len(ranges) < len(ds) / 3  # still merged, up to the budget


def test_a_planning_failure_fails_its_batch(packed, monkeypatch):
    def broken(reads, coalescing):
        raise RuntimeError("planning broke")

    monkeypatch.setattr("concurrent_loader.sources.coalesce.plan_reads", broken)
    ds = ShardDataset(memory_shards(packed))
    pipeline = BatchPipeline(ds, [[0, 1], [2, 3]], collate_fn=list, options=PipelineOptions())
    with pytest.raises(RuntimeError, match="planning broke"):
        list(pipeline)
