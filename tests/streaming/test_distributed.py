"""ShardOrderSampler under a real torch.distributed process group (gloo, 2 ranks).

The sampler is made before ``init_process_group`` and given no rank: it reads rank and
world size when iteration starts. Each rank's ConcurrentDataLoader then yields its own
whole shards, the same number of samples on both ranks, and together every sample.
"""

from __future__ import annotations

import multiprocessing
import socket
from typing import Any

import pytest
import torch.distributed as dist

from concurrent_loader import ConcurrentDataLoader, ObjectDataset
from concurrent_loader.streaming import ShardOrderSampler
from concurrent_loader.testing.memory import MemoryConfig

LENGTHS = [8, 13, 5, 9, 11, 7]


def index_of(data: bytes | bytearray) -> int:
    return int(bytes(data[:6]))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def rank_main(rank: int, port: int, results: Any) -> None:
    objects = {f"{i:05d}.bin": f"{i:06d}".encode().ljust(16, b".") for i in range(sum(LENGTHS))}
    sampler = ShardOrderSampler(LENGTHS, buffer_size=6, seed=1)  # before the group exists
    sampler.set_epoch(2)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        loader = ConcurrentDataLoader(
            ObjectDataset(MemoryConfig(objects), decode=index_of),
            batch_size=4,
            sampler=sampler,
            collate_fn=list,
        )
        got = [i for batch in loader for i in batch]
        results.put((rank, got, len(sampler), sampler.plan()[0]))
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
@pytest.mark.skipif(not dist.is_available(), reason="torch.distributed is not available")
def test_each_rank_streams_its_own_whole_shards():
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    port = free_port()
    ranks = [context.Process(target=rank_main, args=(r, port, results)) for r in range(2)]
    for process in ranks:
        process.start()
    try:
        got = dict(
            (r, (indices, n, shards))
            for r, indices, n, shards in (results.get(timeout=60) for _ in ranks)
        )
    finally:
        for process in ranks:
            process.join(timeout=30)
    assert all(p.exitcode == 0 for p in ranks)
    (a, n_a, shards_a), (b, n_b, shards_b) = got[0], got[1]
    assert len(a) == len(b) == n_a == n_b
    assert not set(shards_a) & set(shards_b)
    assert set(shards_a) | set(shards_b) == set(range(len(LENGTHS)))
    assert set(a) | set(b) == set(range(sum(LENGTHS)))  # padded: every sample at least once
    # The same order as a sampler told its rank explicitly.
    for rank, indices in ((0, a), (1, b)):
        explicit = ShardOrderSampler(LENGTHS, buffer_size=6, seed=1, rank=rank, world_size=2)
        explicit.set_epoch(2)
        assert indices == list(explicit)
