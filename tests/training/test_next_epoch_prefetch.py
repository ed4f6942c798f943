"""Next-epoch prefetch with persistent workers, against the real S3 server through the proxy.

Persistent workers fetch their first batches of the next epoch while the current one drains.
The GETs the proxy counts tell whether those were used (each object fetched once per epoch)
or dropped (fetched again); the batches, compared by sample identity (the SHA-256 of each
object's bytes) with a stock DataLoader's, tell that the order is exactly torch's either way.
"""

from __future__ import annotations

import gc
import hashlib
import time

import pytest
import torch
from torch.utils.data import DataLoader

from concurrent_loader import ConcurrentDataLoader, FetchConfig, HedgeConfig, ObjectDataset
from concurrent_loader.stores import S3Config

BATCH_SIZE = 4  # 24 objects: 6 batches, 3 per worker
WORKERS = 2
PREFETCH = 2
# GETs of the next epoch made ahead: each worker's first PREFETCH batches of it.
AHEAD = WORKERS * PREFETCH * BATCH_SIZE
SEED = 5


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture
def setup(image_dataset, s3_env, proxy_factory):
    proxy = proxy_factory(latency_ms=20)
    keys = [key for key, _, _ in image_dataset.files]
    digests = [digest for _, _, digest in image_dataset.files]
    dataset = ObjectDataset(
        S3Config.from_url(image_dataset.s3_url, endpoint_url=proxy.endpoint_url),
        keys,
        decode=sha256_hex,
        # GETs are counted: no hedge may add one.
        fetch_config=FetchConfig(max_inflight_requests=8, hedge=HedgeConfig(enabled=False)),
    )
    loader = ConcurrentDataLoader(
        dataset,
        batch_size=BATCH_SIZE,
        shuffle=True,
        generator=torch.Generator().manual_seed(SEED),
        num_workers=WORKERS,
        persistent_workers=True,
        prefetch_batches=PREFETCH,
    )
    held = [proxy, loader, digests]
    yield held
    # The persistent workers (and their connections to the proxy) end before the proxy stops.
    held.clear()
    del loader
    gc.collect()


def stock_epochs(digests: list[str], epochs: int) -> list[list[list[str]]]:
    """What a stock DataLoader with the same arguments gives, as sample identities."""
    stock = DataLoader(
        range(len(digests)),
        batch_size=BATCH_SIZE,
        shuffle=True,
        generator=torch.Generator().manual_seed(SEED),
        num_workers=WORKERS,
        persistent_workers=True,
    )
    return [[[digests[i] for i in batch.tolist()] for batch in stock] for _ in range(epochs)]


def gets(proxy) -> int:
    return int(proxy.stats()["requests_by_method"].get("GET", 0))


def settled_gets(proxy, at_least: int, timeout: float = 20) -> int:
    """The GET count once it reached ``at_least`` and then stayed put a moment."""
    deadline = time.monotonic() + timeout
    while gets(proxy) < at_least and time.monotonic() < deadline:
        time.sleep(0.02)
    time.sleep(0.3)  # predicted GETs are made at once: none should follow
    return gets(proxy)


def epoch(loader) -> list[list[str]]:
    return [list(batch) for batch in loader]


def test_the_next_epoch_s_first_batches_are_fetched_ahead_and_used(setup):
    proxy, loader, digests = setup
    expected = stock_epochs(digests, 3)
    n = len(digests)
    assert epoch(loader) == expected[0]
    # While the epoch drained, each worker fetched its first batches of the next one.
    assert settled_gets(proxy, n + AHEAD) == n + AHEAD
    assert epoch(loader) == expected[1]
    # Those were delivered, not fetched again: one GET per object per epoch, plus the third
    # epoch's fetched ahead.
    assert settled_gets(proxy, 2 * n + AHEAD) == 2 * n + AHEAD
    assert epoch(loader) == expected[2]
    assert settled_gets(proxy, 3 * n + AHEAD) == 3 * n + AHEAD


def test_a_changed_plan_drops_what_was_fetched_ahead(setup):
    proxy, loader, digests = setup
    expected = stock_epochs(digests, 1)
    n = len(digests)
    before_the_first_epoch = loader.state_dict()
    assert epoch(loader) == expected[0]
    assert settled_gets(proxy, n + AHEAD) == n + AHEAD
    # Replay the first epoch: its plan is not the one predicted.
    loader.load_state_dict(before_the_first_epoch)
    assert epoch(loader) == expected[0]
    # The batches fetched ahead were dropped and the epoch fetched everything itself.
    assert settled_gets(proxy, 2 * n + 2 * AHEAD) == 2 * n + 2 * AHEAD
