"""ShardOrderSampler under ConcurrentDataLoader: in-order batches and exact mid-epoch resume.

The dataset is a stand-in for a shard dataset (objects numbered shard by shard on the
in-memory store; each body starts with its index), so a batch names exactly the samples it
holds. The loader's own resume (``loader/state.py``) records the epoch and the batches
received; the sampler's order is a function of (seed, epoch), so setting the same epoch
redraws the same plan.
"""

from __future__ import annotations

import pytest

from concurrent_loader import ConcurrentDataLoader, ObjectDataset
from concurrent_loader.streaming import ShardOrderSampler
from concurrent_loader.testing.memory import MemoryConfig

LENGTHS = [9, 14, 6, 11, 10]
BATCH = 4


def index_of(data: bytes | bytearray) -> int:
    return int(bytes(data[:6]))


def make_loader(num_workers: int, epoch: int) -> ConcurrentDataLoader:
    objects = {f"{i:05d}.bin": f"{i:06d}".encode().ljust(32, b".") for i in range(sum(LENGTHS))}
    dataset = ObjectDataset(MemoryConfig(objects, latency_s=0.001), decode=index_of)
    sampler = ShardOrderSampler(LENGTHS, buffer_size=12, seed=3)
    sampler.set_epoch(epoch)
    return ConcurrentDataLoader(
        dataset,
        batch_size=BATCH,
        sampler=sampler,
        num_workers=num_workers,
        collate_fn=list,
        multiprocessing_context="fork" if num_workers else None,
    )


def test_batches_follow_the_sampler_exactly():
    loader = make_loader(0, epoch=2)
    order = list(loader.sampler)
    got = [i for batch in loader for i in batch]
    assert got == order
    assert sorted(got) == list(range(sum(LENGTHS)))


@pytest.mark.parametrize(("num_workers", "taken"), [(0, 3), (2, 5)])
def test_resume_mid_epoch_continues_with_exactly_the_batches_left(num_workers, taken):
    # The order depends on the workers (each streams shards of its own): the same workers.
    reference = list(make_loader(num_workers, epoch=1))
    loader = make_loader(num_workers, epoch=1)
    seen = []
    for batch in loader:
        seen.append(batch)
        if len(seen) == taken:
            state = loader.state_dict()
            break
    del loader
    resumed = make_loader(num_workers, epoch=1)
    resumed.load_state_dict(state)
    rest = list(resumed)
    assert seen + rest == reference
    assert len(rest) == len(reference) - taken
