"""GCS over HTTPS with a private CA (``ca_bundle``) and through an ``HTTP_PROXY``: the
transport's TLS and proxy paths, with fake-gcs-server behind them."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from concurrent_loader import ConcurrentDataLoader, ObjectDataset
from concurrent_loader.errors import CertificateRefused
from concurrent_loader.testing import ForwardProxy, ServerCertificate, TlsFront, make_private_ca

OBJECTS = {"a.bin": b"a" * 3000, "dir/b c.bin": b"b" * 5000}
PREFIX = "network/"


@pytest.fixture(scope="module")
def private_ca(tmp_path_factory: pytest.TempPathFactory) -> ServerCertificate:
    return make_private_ca(tmp_path_factory.mktemp("gcs_ca"))


@pytest.fixture
def filled(gcs_server, gcs_bucket):
    for key, data in OBJECTS.items():
        gcs_server.put_object(gcs_bucket, PREFIX + key, data)
    return gcs_server


@pytest.fixture
def tls_front(filled, private_ca) -> Iterator[TlsFront]:
    with TlsFront(filled.endpoint_url, private_ca) as front:
        yield front


def read(ds: ObjectDataset) -> dict[str, bytes]:
    got = [bytes(body) for batch in ConcurrentDataLoader(ds, batch_size=2) for body in batch]
    return dict(zip(ds.keys, got, strict=True))


def test_https_with_a_private_ca_bundle(filled, gcs_bucket, tls_front, private_ca, gcs_env):
    config = filled.store_config(
        gcs_bucket, PREFIX, endpoint_url=tls_front.endpoint_url, ca_bundle=str(private_ca.ca_bundle)
    )
    assert config.endpoint_url.startswith("https://")
    with ObjectDataset(config) as ds:  # listed and read over TLS
        assert read(ds) == OBJECTS


def test_an_untrusted_certificate_is_refused_naming_the_object(
    filled, gcs_bucket, tls_front, gcs_env
):
    config = filled.store_config(gcs_bucket, PREFIX, endpoint_url=tls_front.endpoint_url)
    with ObjectDataset(config, ["a.bin"]) as ds, pytest.raises(CertificateRefused) as caught:
        ds[0]
    assert caught.value.url == f"gs://{gcs_bucket}/{PREFIX}a.bin"


def test_gets_and_listing_go_through_http_proxy_to_the_endpoint_only(
    filled, gcs_bucket, gcs_env, monkeypatch
):
    with ForwardProxy() as proxy:
        monkeypatch.setenv("HTTP_PROXY", proxy.url)
        with ObjectDataset(filled.store_config(gcs_bucket, PREFIX)) as ds:
            assert read(ds) == OBJECTS
        requests = list(proxy.requests)
    endpoint = filled.endpoint_url
    assert requests and all(
        r.startswith(f"GET {endpoint}/storage/v1/b/{gcs_bucket}/o") for r in requests
    )
    gets = sorted(r for r in requests if "alt=media" in r)
    assert gets == sorted(
        f"GET {endpoint}/storage/v1/b/{gcs_bucket}/o/{name}?alt=media HTTP/1.1"
        for name in ("network%2Fa.bin", "network%2Fdir%2Fb%20c.bin")
    )
    assert len(requests) == len(gets) + 1  # one listing page
