"""End to end against three independent S3 implementations: SeaweedFS, moto and rclone.

Every test runs once per server (``any_server``). Samples are checked for identity: each
one byte-identical (or pixel-identical) to its source and in the sampler's order, so each
comes exactly once.
"""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader

from concurrent_loader import (
    AccessDenied,
    ConcurrentDataLoader,
    DecodeError,
    ImageFolder,
    ObjectDataset,
)
from concurrent_loader.decode import ImageDecoder
from concurrent_loader.errors import Reason
from concurrent_loader.stores import S3Config
from concurrent_loader.testing import S3ServerProcess, TemporaryCredentials

from .conftest import (
    EMPTY_KEY,
    ODD_KEYS,
    ServerData,
    attempts_of,
    drop_traceback,
    join_executor_threads,
)


def sampler_order(n: int, batch_size: int, seed: int) -> list[int]:
    """The indices a stock DataLoader visits, in order, with a generator seeded with ``seed``."""
    stock = DataLoader(
        range(n), batch_size=batch_size, shuffle=True, generator=torch.Generator().manual_seed(seed)
    )
    return [i for batch in stock for i in batch.tolist()]


def read_all(ds: ObjectDataset, num_workers: int, seed: int = 5, batch_size: int = 4) -> list:
    join_executor_threads()
    loader = ConcurrentDataLoader(
        ds,
        batch_size=batch_size,
        shuffle=True,
        num_workers=num_workers,
        generator=torch.Generator().manual_seed(seed),
    )
    return [sample for batch in loader for sample in batch]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_image_folder_items_match_their_files(server_data: ServerData, server_env, num_workers):
    ds = ImageFolder(server_data.image_url, image_size=32)
    assert ds.classes == sorted({cls for _, cls, _ in server_data.images})
    assert sorted(ds.keys) == sorted(key for key, _, _ in server_data.images)
    join_executor_threads()
    loader = ConcurrentDataLoader(
        ds,
        batch_size=5,
        shuffle=True,
        num_workers=num_workers,
        generator=torch.Generator().manual_seed(3),
    )
    images, labels = (torch.cat(parts) for parts in zip(*loader, strict=True))
    order = sampler_order(len(ds), 5, 3)
    assert len(images) == len(order) == len(server_data.images)
    decode = ImageDecoder(32)
    for position, index in enumerate(order):
        key = ds.keys[index]
        assert labels[position].item() == ds.classes.index(key.split("/", 1)[0])
        reference = decode((server_data.image_root / key).read_bytes())
        assert torch.equal(images[position], reference), key


@pytest.mark.parametrize("num_workers", [0, 2])
def test_image_bytes_are_the_files(server_data: ServerData, server_env, num_workers):
    ds = ObjectDataset(server_data.image_url)
    got = read_all(ds, num_workers, batch_size=6)
    order = sampler_order(len(ds), 6, 5)
    assert got == [(server_data.image_root / ds.keys[i]).read_bytes() for i in order]


@pytest.mark.parametrize(
    ("num_workers", "keys_from"), [(0, "listing"), (2, "listing"), (2, "given")]
)
def test_odd_keys_read_byte_identical(server_data: ServerData, server_env, num_workers, keys_from):
    # Spaces, '+', '%' (and a literal '%2F'), unicode, '?' and '#', a ~1,000-byte key and
    # a zero-byte object: listed verbatim and read back as stored.
    keys = None if keys_from == "listing" else list(ODD_KEYS)
    ds = ObjectDataset(server_data.odd_url, keys)
    if keys is None:
        assert list(ds.keys) == sorted(server_data.odd)
    got = read_all(ds, num_workers)
    order = sampler_order(len(ds), 4, 5)
    assert got == [server_data.odd[ds.keys[i]] for i in order]
    # The raw bytes of an empty object are empty bytes (ObjectDataset: "the raw bytes
    # when decode is None"), not an error.
    assert got[order.index(list(ds.keys).index(EMPTY_KEY))] == b""


def test_empty_object_decoded_as_an_image_is_a_decode_error(server_data: ServerData, server_env):
    ds = ObjectDataset(server_data.odd_url, [EMPTY_KEY], decode=ImageDecoder(16))
    with pytest.raises(DecodeError) as info:
        list(ConcurrentDataLoader(ds, batch_size=1))
    error = drop_traceback(info)
    assert isinstance(error, DecodeError)
    assert error.cause == Reason.EMPTY_OBJECT
    assert error.url == server_data.odd_url + EMPTY_KEY


def session_of(server: S3ServerProcess) -> TemporaryCredentials:
    """A session from ``server``'s STS; the test is skipped on a server that has none."""
    try:
        return server.temporary_credentials()
    except NotImplementedError as exc:
        pytest.skip(f"{server.name}: {exc}")


@pytest.mark.parametrize("given_as", ["env", "options"])
def test_session_token_credentials(server_data: ServerData, server_env, monkeypatch, given_as):
    session = session_of(server_data.server)
    assert session.access_key != server_data.server.access_key
    if given_as == "env":
        for name, value in session.env().items():
            monkeypatch.setenv(name, value)
        ds = ObjectDataset(server_data.odd_url)
    else:
        ds = ObjectDataset(
            S3Config.from_url(
                server_data.odd_url,
                aws_access_key_id=session.access_key,
                aws_secret_access_key=session.secret_key,
                aws_session_token=session.session_token,
            )
        )
    assert list(ds.keys) == sorted(server_data.odd)  # listed with the session
    got = read_all(ds, num_workers=2)
    assert got == [server_data.odd[ds.keys[i]] for i in sampler_order(len(ds), 4, 5)]


def test_wrong_session_token_is_refused_at_once(server_data: ServerData, server_env, monkeypatch):
    session = session_of(server_data.server)
    forged = session.session_token[:-8] + "AAAAAAAA"
    for name, value in session.env().items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("AWS_SESSION_TOKEN", forged)
    key = "space in name.bin"
    ds = ObjectDataset(server_data.odd_url, [key])
    with pytest.raises(AccessDenied) as info:
        list(ConcurrentDataLoader(ds, batch_size=1))
    error = drop_traceback(info)
    assert attempts_of(error) == 1
    assert error.url == server_data.odd_url + key
    assert forged not in str(error) and session.secret_key not in str(error)
    with pytest.raises(AccessDenied) as listing:
        ObjectDataset(server_data.odd_url)
    assert server_data.odd_url in str(drop_traceback(listing))
