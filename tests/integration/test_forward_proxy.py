"""An HTTP forward proxy end to end: ``HTTP_PROXY`` / ``HTTPS_PROXY`` and ``NO_PROXY``.

With ``HTTP_PROXY`` set, the listing and every GET go to the proxy in absolute form; with
``HTTPS_PROXY`` and an HTTPS endpoint, through ``CONNECT`` tunnels (the proxy sees no
request); with ``NO_PROXY`` naming the endpoint's host, nothing goes to the proxy. The
proxy records every request line, so the test counts them.
"""

from __future__ import annotations

from collections.abc import Iterator
from urllib.parse import quote

import pytest
import torch

from concurrent_loader import ConcurrentDataLoader, ObjectDataset
from concurrent_loader.testing import ForwardProxy, ServerCertificate, TlsFront

from .conftest import BUCKET, ODD_PREFIX, ServerData, join_executor_threads


@pytest.fixture
def forward_proxy() -> Iterator[ForwardProxy]:
    with ForwardProxy() as proxy:
        yield proxy


def read_all(ds: ObjectDataset, *, runtime_closed: bool = True) -> dict[str, bytes]:
    if runtime_closed:  # else its executor's thread waits, idle: nothing to join
        join_executor_threads()
    loader = ConcurrentDataLoader(
        ds, batch_size=3, shuffle=True, num_workers=2, generator=torch.Generator().manual_seed(2)
    )
    got = [body for batch in loader for body in batch]
    assert len(got) == len(ds)
    return dict(zip((ds.keys[i] for i in _order(len(ds))), got, strict=True))


def _order(n: int) -> list[int]:
    """The indices a stock DataLoader visits with the same arguments, in order."""
    from torch.utils.data import DataLoader

    stock = DataLoader(
        range(n), batch_size=3, shuffle=True, generator=torch.Generator().manual_seed(2)
    )
    return [i for batch in stock for i in batch.tolist()]


def test_gets_and_listing_go_through_http_proxy(
    server_data: ServerData, server_env, forward_proxy: ForwardProxy, monkeypatch
):
    monkeypatch.setenv("HTTP_PROXY", forward_proxy.url)
    ds = ObjectDataset(server_data.odd_url)
    assert read_all(ds) == server_data.odd

    endpoint = server_data.server.endpoint_url
    listings = [r for r in forward_proxy.requests if "list-type=2" in r]
    gets = [r for r in forward_proxy.requests if r not in listings]
    assert len(listings) == 1
    assert listings[0].startswith(f"GET {endpoint}/{BUCKET}?")
    # One GET per object, each in absolute form, the key as the library encodes it.
    want = {
        f"GET {endpoint}/{BUCKET}/{quote(ODD_PREFIX + key, safe='/~')} HTTP/1.1"
        for key in server_data.odd
    }
    assert sorted(gets) == sorted(want)


def test_no_proxy_naming_the_endpoint_bypasses_the_proxy(
    server_data: ServerData, server_env, forward_proxy: ForwardProxy, monkeypatch
):
    monkeypatch.setenv("HTTP_PROXY", forward_proxy.url)
    monkeypatch.setenv("HTTPS_PROXY", forward_proxy.url)
    monkeypatch.setenv("NO_PROXY", "localhost,127.0.0.1")
    ds = ObjectDataset(server_data.odd_url)
    assert read_all(ds) == server_data.odd
    assert forward_proxy.requests == []


def test_https_goes_through_connect_tunnels(
    server_data: ServerData,
    server_env,
    forward_proxy: ForwardProxy,
    private_ca: ServerCertificate,
    monkeypatch,
    runtime_lease,
):
    with TlsFront(server_data.server.endpoint_url, private_ca) as front:
        monkeypatch.setenv("AWS_ENDPOINT_URL", front.endpoint_url)
        monkeypatch.setenv("AWS_CA_BUNDLE", str(private_ca.ca_bundle))
        monkeypatch.setenv("HTTPS_PROXY", forward_proxy.url)
        ds = ObjectDataset(server_data.odd_url)
        front.wait_idle()  # no handshake going on in this process when workers fork
        assert read_all(ds, runtime_closed=False) == server_data.odd
        tunnels = forward_proxy.requests
        # The listing's tunnel, then at least one per worker; no request is readable.
        assert len(tunnels) >= 2
        assert set(tunnels) == {f"CONNECT {front.address} HTTP/1.1"}
        assert front.handshakes == len(tunnels) and front.refused == 0
