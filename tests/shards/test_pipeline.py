"""The pipeline over shards, on the in-memory store (our own logic only): a failure while
planning a batch fails that batch instead of leaving it unfinished; a failed read names the
sample's shard, member and offset."""

from __future__ import annotations

import pytest

from concurrent_loader import ShardDataset
from concurrent_loader.errors import LoaderError, ObjectNotFound
from concurrent_loader.pipeline import BatchPipeline, PipelineOptions
from concurrent_loader.testing.memory import MemoryConfig, MemoryStore


def memory_shards(packed) -> MemoryConfig:
    objects = {p.name: p.read_bytes() for p in packed.local.iterdir()}
    return MemoryConfig(objects, name="shards")


def test_a_planning_failure_fails_its_batch(packed, monkeypatch):
    def broken(samples, capabilities, parts):
        raise RuntimeError("planning broke")

    monkeypatch.setattr("concurrent_loader.pipeline.remote.plan_fetches", broken)
    ds = ShardDataset(memory_shards(packed))
    pipeline = BatchPipeline(ds, [[0, 1], [2, 3]], collate_fn=list, options=PipelineOptions())
    with pytest.raises(RuntimeError, match="planning broke"):
        list(pipeline)


def test_a_failed_read_names_the_sample_member_and_offset(packed, monkeypatch):
    ds = ShardDataset(memory_shards(packed))
    read = MemoryStore._read

    def failing(self, key, byte_range):
        if byte_range is not None and byte_range.start > 0:
            raise ObjectNotFound("the store broke", url=self.config.url_for(key), stage="fetch")
        return read(self, key, byte_range)

    monkeypatch.setattr(MemoryStore, "_read", failing)
    pipeline = BatchPipeline(ds, [[1]], collate_fn=list, options=PipelineOptions())
    with pytest.raises(LoaderError) as caught:
        list(pipeline)
    assert ds.source.where(1) in str(caught.value)
    assert "the store broke" in str(caught.value)
