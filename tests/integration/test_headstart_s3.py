"""The head start against the local S3 server, with worker processes: forked workers decode
the bodies the main process fetched ahead (on the first epoch, each worker's first batch,
relayed as it arrives; on the next, the first batches of the predicted plan), so they send
fewer GETs of their own; spawned ones fetch everything themselves; both deliver exactly the
epochs a stock DataLoader would."""

from __future__ import annotations

import time

import pytest
import torch
from torch.utils.data import BatchSampler, RandomSampler

from concurrent_loader import ConcurrentDataLoader

from .test_loader_s3 import hashed_dataset, sha_of

BATCH = 4


def stock_order(count: int, seed: int, epochs: int) -> list[list[list[int]]]:
    """Each epoch's batches as torch draws them when each epoch starts new workers: the
    workers' base seed, then the epoch's permutation, from the same generator."""
    reference = torch.Generator().manual_seed(seed)
    found = []
    for _ in range(epochs):
        torch.empty((), dtype=torch.int64).random_(generator=reference)
        sampler = RandomSampler(range(count), generator=reference)
        found.append([list(b) for b in BatchSampler(sampler, BATCH, False)])
    return found


@pytest.mark.parametrize(("context", "ahead"), [("fork", True), ("spawn", False)])
def test_new_workers_start_from_the_bodies_fetched_ahead(image_dataset, s3_env, context, ahead):
    ds = hashed_dataset(image_dataset)
    digests = sha_of(image_dataset)
    loader = ConcurrentDataLoader(
        ds,
        batch_size=BATCH,
        shuffle=True,
        num_workers=2,
        multiprocessing_context=context,
        generator=torch.Generator().manual_seed(3),
        prefetch_batches=2,
        head_start=True,
    )
    want = stock_order(len(ds), 3, 2)
    requests = []
    for epoch in range(2):
        got = []
        for batch in loader:  # as a training step would: time for the head start to arrive
            got.append(list(batch))
            time.sleep(0.05)
        assert got == [[digests[i] for i in b] for b in want[epoch]]
        requests.append(loader.stats()["requests"])
    first, second = requests[0], requests[1] - requests[0]  # the workers' GETs per epoch
    if ahead:
        # Epoch 0: each worker's first batch came from the main process (a body far behind
        # the others, on a loaded machine, is left to its worker); epoch 1: the first two of
        # each (the loader's head start on the next epoch).
        assert len(ds) - 2 * BATCH <= first < len(ds)
        assert second == len(ds) - 2 * 2 * BATCH
    else:
        assert first == second == len(ds)
