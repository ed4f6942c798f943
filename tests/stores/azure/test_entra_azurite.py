"""Entra ID end to end: Azurite over HTTPS with ``--oauth basic`` checks each GET's bearer
token (issuer, audience, lifetime); a credential given as ``credential=`` is made in each
process, asked once per process for all its concurrent GETs, and a token Azurite refuses
is ``AccessDenied`` with its code."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from concurrent_loader import ConcurrentDataLoader, ObjectDataset
from concurrent_loader.errors import AccessDenied
from concurrent_loader.stores.azure import EntraId
from concurrent_loader.testing.azurite_server import (
    AzuriteServer,
    EmulatorTokenCredential,
    find_azurite,
)
from concurrent_loader.testing.tls import make_private_ca

KEYS = [f"k/{i:03d}.bin" for i in range(40)]


class ForeignAudience(EmulatorTokenCredential):
    audience = "https://vault.azure.net"


class CountingCredential(EmulatorTokenCredential):
    made: list[CountingCredential] = []

    def __init__(self) -> None:
        super().__init__()
        CountingCredential.made.append(self)


@pytest.fixture(scope="module")
def azurite_tls(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AzuriteServer]:
    if find_azurite() is None:
        pytest.skip("azurite-blob is not installed: run scripts/setup.sh")
    certificate = make_private_ca(Path(tmp_path_factory.mktemp("azurite-ca")))
    with AzuriteServer(certificate=certificate) as server:
        server.create_bucket("secure")
        for key in KEYS:
            server.put_object("secure", key, key.encode() * 100)
        yield server


def test_bearer_tokens_read_and_list_and_one_fetch_serves_concurrent_gets(azurite_tls):
    CountingCredential.made.clear()
    root = azurite_tls.store_config("secure", "k/", credential=CountingCredential)
    assert root.credential == EntraId(CountingCredential) and root.endpoint.startswith("https")
    with ObjectDataset(root, decode=hashlib.sha256) as ds:  # a listing, then GETs
        assert sorted(ds.keys) == sorted(key.removeprefix("k/") for key in KEYS)
        loader = ConcurrentDataLoader(ds, batch_size=40, collate_fn=list)
        [batch] = list(loader)
    assert [h.digest() for h in batch] == [
        hashlib.sha256(("k/" + key).encode() * 100).digest() for key in ds.keys
    ]
    # Made in this process (the dataset's listing and the loader's pipeline share one
    # store), and asked once for the 40 concurrent GETs and the listing.
    assert sum(c.calls for c in CountingCredential.made) == len(CountingCredential.made) >= 1


def test_a_token_for_another_audience_is_refused_with_the_services_code(azurite_tls):
    root = azurite_tls.store_config("secure", "k/", credential=ForeignAudience)
    with ObjectDataset(root, ["000.bin"]) as ds, pytest.raises(AccessDenied) as refused:
        ds[0]
    assert refused.value.code == "AuthenticationFailed" and refused.value.status == 403
    assert "eyJ" not in str(refused.value)  # no token in the message
