"""DDP sharding, in a real multi-process run: ranks started with the ``spawn`` method join
a gloo process group over TCP and read the local S3 server through ``ConcurrentDataLoader``
with worker processes; each rank writes the identities (SHA-256 of the bytes) of the samples
it got, epoch by epoch, and the parent checks them against ``DistributedSampler``'s
semantics: disjoint shards whose union is the dataset, padding (or dropping) the remainder
exactly as ``DistributedSampler`` does, the same reshuffle on every rank per epoch.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import multiprocessing
import os
import socket
from collections import Counter
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch.utils.data import DistributedSampler

from concurrent_loader import ConcurrentDataLoader, ObjectDataset

BATCH_SIZE = 4
N = 23  # of the 24 test images: 2 or 3 ranks need one padded sample (or drop some)


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def identities(loader: ConcurrentDataLoader) -> list[str]:
    return [digest for batch in loader for digest in batch]


def _rank_main(rank: int, port: int, env: dict[str, str], args: dict[str, Any]) -> None:
    """One rank. Runs in a fresh (spawned) interpreter; writes ``rank<r>.json``."""
    os.environ.update(env)
    # A spawned process defaults to spawning its own children; a rank started by torchrun
    # forks its DataLoader workers, and so does this one (2 s less per worker start).
    multiprocessing.set_start_method("fork", force=True)
    ds = ObjectDataset(args["url"], args["keys"], decode=sha256_hex)
    # Built before init_process_group: the loader reads rank and world size when
    # iteration starts.
    padded = ConcurrentDataLoader(
        ds,
        batch_size=BATCH_SIZE,
        shuffle=True,
        seed=0,
        drop_last=False,
        num_workers=1,
        persistent_workers=True,  # each epoch's shard reaches the same worker process
    )
    dropped = ConcurrentDataLoader(
        ds, batch_size=BATCH_SIZE, shuffle=True, seed=5, drop_last=True, num_workers=2
    )
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=args["world_size"],
        timeout=timedelta(seconds=60),
    )
    try:
        out: dict[str, Any] = {"len": len(padded)}
        out["padded"] = []
        for epoch in range(2):
            padded.set_epoch(epoch)
            out["padded"].append(identities(padded))
        # set_epoch(0) again repeats epoch 0's order.
        padded.set_epoch(0)
        out["padded_again"] = identities(padded)
        # Without set_epoch calls the epoch still advances each pass, on every rank alike.
        out["dropped"] = [identities(dropped) for _ in range(2)]
        # The user's own DistributedSampler (built after init_process_group, as usual).
        sampler: DistributedSampler[Any] = DistributedSampler(ds, shuffle=True, seed=3)
        own = ConcurrentDataLoader(ds, batch_size=BATCH_SIZE, sampler=sampler, num_workers=1)
        out["own_sampler"] = []
        for epoch in range(2):
            sampler.set_epoch(epoch)
            out["own_sampler"].append(identities(own))
        Path(args["out_dir"], f"rank{rank}.json").write_text(json.dumps(out))
    finally:
        dist.destroy_process_group()


def expected(
    digests: list[str], world_size: int, rank: int, epoch: int, *, seed: int, drop_last: bool
) -> list[str]:
    """What ``DistributedSampler`` gives ``rank`` in ``epoch``."""
    sampler: DistributedSampler[int] = DistributedSampler(
        range(len(digests)),  # type: ignore[arg-type]
        num_replicas=world_size,
        rank=rank,
        shuffle=True,
        seed=seed,
        drop_last=drop_last,
    )
    sampler.set_epoch(epoch)
    return [digests[i] for i in sampler]


@pytest.mark.parametrize(
    "world_size", [2, pytest.param(3, marks=pytest.mark.slow)], ids=["2-ranks", "3-ranks"]
)
def test_ddp_ranks_get_distributed_sampler_shards(image_dataset, s3_env, tmp_path, world_size):
    keys = [key for key, _, _ in image_dataset.files][:N]
    digests = [digest for _, _, digest in image_dataset.files][:N]
    assert len(set(digests)) == N
    args = {
        "url": image_dataset.s3_url,
        "keys": keys,
        "out_dir": str(tmp_path),
        "world_size": world_size,
    }
    port = free_port()
    context = multiprocessing.get_context("spawn")
    ranks = [
        context.Process(target=_rank_main, args=(rank, port, dict(os.environ), args))
        for rank in range(world_size)
    ]
    for process in ranks:
        process.start()
    for process in ranks:
        process.join(timeout=100)
    for process in ranks:
        if process.is_alive():
            process.kill()
            process.join()
    assert [p.exitcode for p in ranks] == [0] * world_size
    results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(world_size)]

    per_rank = -(-N // world_size)  # 12 or 8: the shards hold one padded repeat in all
    assert [r["len"] for r in results] == [-(-per_rank // BATCH_SIZE)] * world_size

    # Padded (drop_last=False): exactly DistributedSampler's shards, in its order.
    for epoch in range(2):
        shards = [r["padded"][epoch] for r in results]
        for rank, shard in enumerate(shards):
            assert shard == expected(digests, world_size, rank, epoch, seed=0, drop_last=False)
            assert len(shard) == per_rank
        union = Counter(d for shard in shards for d in shard)
        assert set(union) == set(digests)  # every sample reaches some rank
        padding = union - Counter(digests)
        # The remainder is padded with the epoch's first samples, as DistributedSampler does.
        assert sum(padding.values()) == world_size * per_rank - N == 1
        # Disjoint but for the padding.
        for a, b in itertools.combinations(shards, 2):
            assert set(a) & set(b) <= set(padding)
    assert results[0]["padded"][0] != results[0]["padded"][1]  # reshuffled per epoch
    for r in results:
        assert r["padded_again"] == r["padded"][0]

    # drop_last=True: the tail is dropped instead; epochs advance without set_epoch.
    for epoch in range(2):
        shards = [r["dropped"][epoch] for r in results]
        for rank, shard in enumerate(shards):
            want = expected(digests, world_size, rank, epoch, seed=5, drop_last=True)
            assert len(want) == N // world_size
            # drop_last is also the loader's: the last partial batch of a shard goes too.
            assert shard == want[: len(want) // BATCH_SIZE * BATCH_SIZE]
        for a, b in itertools.combinations(shards, 2):
            assert not set(a) & set(b)
    assert results[0]["dropped"][0] != results[0]["dropped"][1]

    # The user's own DistributedSampler.
    for epoch in range(2):
        for rank, r in enumerate(results):
            assert r["own_sampler"][epoch] == expected(
                digests, world_size, rank, epoch, seed=3, drop_last=False
            )


def test_without_a_process_group_the_loader_reads_everything(image_dataset, s3_env):
    assert not dist.is_initialized()
    keys = [key for key, _, _ in image_dataset.files][:N]
    ds = ObjectDataset(image_dataset.s3_url, keys, decode=sha256_hex)
    loader = ConcurrentDataLoader(
        ds, batch_size=BATCH_SIZE, shuffle=True, generator=torch.Generator().manual_seed(0)
    )
    got = identities(loader)
    assert sorted(got) == sorted(d for _, _, d in image_dataset.files[:N])
