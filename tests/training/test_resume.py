"""Exact mid-epoch resume: ``state_dict()`` after ``k`` batches, ``load_state_dict()`` into a
fresh loader (also in a fresh process), and the continuation is exactly the batches an
uninterrupted run gives, in the same order, compared by sample identity (the SHA-256 of
each object's bytes)."""

from __future__ import annotations

import hashlib
import io
import json
import multiprocessing
import os
import pickle
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import RandomSampler

from concurrent_loader import ConcurrentDataLoader, ConfigError, FetchConfig, ObjectDataset
from concurrent_loader.stores import S3Config

BATCH_SIZE = 5  # 24 objects: batches of 5, 5, 5, 5, 4
SEED = 11
EPOCHS = 2


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def make_loader(
    url: str, keys: list[str], *, num_workers: int, endpoint_url: str | None = None
) -> ConcurrentDataLoader:
    """The loader under test; the interrupted, resumed and reference runs all build it so."""
    fetch_config = FetchConfig(max_inflight_requests=8)
    ds = ObjectDataset(
        S3Config.from_url(url, endpoint_url=endpoint_url),
        keys,
        decode=sha256_hex,
        fetch_config=fetch_config,
    )
    return ConcurrentDataLoader(
        ds,
        batch_size=BATCH_SIZE,
        shuffle=True,
        generator=torch.Generator().manual_seed(SEED),
        num_workers=num_workers,
    )


def run_epochs(loader: ConcurrentDataLoader, epochs: int) -> list[list[list[str]]]:
    return [[list(batch) for batch in loader] for _ in range(epochs)]


def interrupt(loader: ConcurrentDataLoader, k: int | str) -> tuple[list[list[str]], dict]:
    """Take ``k`` batches of the first epoch (``"epoch"``: all of it, the loop ended) and
    return them with the state taken there."""
    if k == "epoch":
        prefix = [list(batch) for batch in loader]
        return prefix, loader.state_dict()
    it = iter(loader)
    prefix = [list(next(it)) for _ in range(int(k))]
    state = loader.state_dict()
    del it  # the interrupted run ends here (workers shut down)
    return prefix, state


def round_trip(state: dict) -> dict:
    """Through torch.save / torch.load (safe default: weights_only) and pickle."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer)
    return pickle.loads(pickle.dumps(loaded))


def continuation(loader: ConcurrentDataLoader, k: int | str) -> list[list[str]]:
    """Iterate a resumed loader to the end of the run: what is left of the first epoch
    (nothing left when the state was taken at the epoch's end), then the second."""
    epochs = EPOCHS - 1 if k == "epoch" else EPOCHS
    return [batch for epoch in run_epochs(loader, epochs) for batch in epoch]


_REFERENCE: dict[str, list[list[list[str]]]] = {}


def reference(url: str, keys: list[str]) -> list[list[list[str]]]:
    """The uninterrupted run: ``EPOCHS`` epochs, batch by batch (computed once)."""
    if url not in _REFERENCE:
        _REFERENCE[url] = run_epochs(make_loader(url, keys, num_workers=0), EPOCHS)
    return _REFERENCE[url]


def flat(epochs: list[list[list[str]]]) -> list[list[str]]:
    return [batch for epoch in epochs for batch in epoch]


@pytest.fixture
def hashed(image_dataset, s3_env):
    keys = [key for key, _, _ in image_dataset.files]
    digests = [digest for _, _, digest in image_dataset.files]
    return image_dataset.s3_url, keys, digests


# k: before any batch, mid-epoch, before the last batch, after the last batch but inside the
# loop, and after the loop ended (epoch boundary).
CUTS = [0, 2, 4, 5, "epoch"]


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("k", CUTS, ids=[f"k={k}" for k in CUTS])
def test_resume_continues_exactly(hashed, num_workers, k):
    url, keys, _ = hashed
    expected = flat(reference(url, keys))

    prefix, state = interrupt(make_loader(url, keys, num_workers=num_workers), k)
    assert prefix == expected[: len(prefix)]
    resumed = make_loader(url, keys, num_workers=num_workers)
    resumed.load_state_dict(round_trip(state))
    rest = continuation(resumed, k)
    assert prefix + rest == expected


def test_the_reference_run_is_a_sound_reference(hashed):
    url, keys, digests = hashed
    epochs = reference(url, keys)
    # Every object once per epoch, in batches of BATCH_SIZE, reshuffled between epochs, ...
    for epoch in epochs:
        assert [len(b) for b in epoch] == [5, 5, 5, 5, 4]
        assert sorted(d for b in epoch for d in b) == sorted(digests)
    assert epochs[0] != epochs[1]
    # ... the same with worker processes, and with a fresh loader built the same way.
    assert run_epochs(make_loader(url, keys, num_workers=2), EPOCHS) == epochs


def test_resume_with_out_of_order_gets(hashed, proxy_factory):
    # Latency 0-60 ms per GET, drawn per request: GETs complete out of order.
    proxy = proxy_factory(latency_ms=30, jitter_ms=30)
    url, keys, _ = hashed
    expected = flat(reference(url, keys))
    for k, num_workers in ((3, 2), (1, 0)):
        loader = make_loader(url, keys, num_workers=num_workers, endpoint_url=proxy.endpoint_url)
        prefix, state = interrupt(loader, k)
        resumed = make_loader(url, keys, num_workers=num_workers, endpoint_url=proxy.endpoint_url)
        resumed.load_state_dict(round_trip(state))
        assert prefix + continuation(resumed, k) == expected
    assert proxy.stats()["max_inflight"] > 1


def test_resume_with_unseeded_shuffle_and_a_user_sampler(hashed):
    url, keys, digests = hashed

    def loaders() -> list[ConcurrentDataLoader]:
        ds = ObjectDataset(url, keys, decode=sha256_hex)
        seed = int(torch.randint(0, 2**62, ()).item())  # from the global RNG too
        sampler = RandomSampler(ds, generator=torch.Generator().manual_seed(seed))
        return [
            # The loader's generator comes from torch's global RNG ...
            ConcurrentDataLoader(ds, batch_size=BATCH_SIZE, shuffle=True),
            # ... or the shuffle is the user's sampler's.
            ConcurrentDataLoader(ds, batch_size=BATCH_SIZE, sampler=sampler),
        ]

    torch.manual_seed(1)
    reference = [run_epochs(loader, EPOCHS) for loader in loaders()]
    torch.manual_seed(1)
    interrupted = [interrupt(loader, 2) for loader in loaders()]
    torch.manual_seed(2)  # the fresh loaders draw other seeds: the state must override them
    for (prefix, state), loader, want in zip(interrupted, loaders(), reference, strict=True):
        loader.load_state_dict(round_trip(state))
        assert prefix + continuation(loader, 2) == [b for epoch in want for b in epoch]
        assert sorted(d for b in want[0] for d in b) == sorted(digests)


def _resume_in_fresh_process(state_path: str, env: dict[str, str], args: dict[str, Any]) -> None:
    """Runs in a new interpreter: build the loader from scratch, load the state, write what
    it yields."""
    os.environ.update(env)
    state = torch.load(state_path)
    loader = make_loader(args["url"], args["keys"], num_workers=args["num_workers"])
    loader.load_state_dict(state)
    rest = continuation(loader, args["k"])
    Path(args["out"]).write_text(json.dumps(rest))


def test_resume_in_a_fresh_process(hashed, tmp_path):
    url, keys, _ = hashed
    expected = flat(reference(url, keys))
    prefix, state = interrupt(make_loader(url, keys, num_workers=2), 2)
    state_path = tmp_path / "loader.pt"
    torch.save(state, state_path)

    out = tmp_path / "rest.json"
    args = {"url": url, "keys": keys, "num_workers": 0, "k": 2, "out": str(out)}
    child = multiprocessing.get_context("spawn").Process(
        target=_resume_in_fresh_process, args=(str(state_path), dict(os.environ), args)
    )
    child.start()
    child.join(timeout=90)
    assert child.exitcode == 0
    assert prefix + json.loads(out.read_text()) == expected


@pytest.mark.parametrize(("saved_with", "resumed_with"), [(0, 2), (2, 0)])
def test_resume_with_another_number_of_workers(hashed, saved_with, resumed_with):
    # The plan is drawn in the main process: how many workers produce it does not matter.
    url, keys, _ = hashed
    prefix, state = interrupt(make_loader(url, keys, num_workers=saved_with), 3)
    resumed = make_loader(url, keys, num_workers=resumed_with)
    resumed.load_state_dict(round_trip(state))
    assert prefix + continuation(resumed, 3) == flat(reference(url, keys))


def test_state_from_another_world_size_is_refused(hashed):
    url, keys, _ = hashed
    _, state = interrupt(make_loader(url, keys, num_workers=0), 2)
    assert (state["rank"], state["world_size"]) == (0, 1)

    loader = make_loader(url, keys, num_workers=0)
    loader.load_state_dict({**state, "rank": 1, "world_size": 2})
    with pytest.raises(ConfigError, match="world size"):
        next(iter(loader))


def test_state_of_an_unknown_version_is_refused(hashed):
    url, keys, _ = hashed
    loader = make_loader(url, keys, num_workers=0)
    state = loader.state_dict()
    with pytest.raises(ConfigError, match="version"):
        loader.load_state_dict({**state, "version": 999})


def test_resume_with_persistent_workers_into_the_next_epoch(hashed):
    url, keys, _ = hashed

    def persistent() -> ConcurrentDataLoader:
        loader = make_loader(url, keys, num_workers=2)
        return ConcurrentDataLoader(
            loader.dataset,
            batch_size=BATCH_SIZE,
            shuffle=True,
            generator=torch.Generator().manual_seed(SEED),
            num_workers=2,
            persistent_workers=True,
        )

    expected = flat(run_epochs(persistent(), EPOCHS))
    prefix, state = interrupt(persistent(), 2)
    resumed = persistent()
    resumed.load_state_dict(round_trip(state))
    # The resumed first epoch writes only its rest; the next, full epoch must still fit the
    # plan the persistent workers share.
    assert prefix + continuation(resumed, 2) == expected
