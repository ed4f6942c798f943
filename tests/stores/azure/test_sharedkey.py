"""The hand-written Shared Key signer against the official SDK's signer
(``azure.storage.blob``'s ``SharedKeyCredentialPolicy``): the same request, key and second
give the same ``Authorization`` header, for blob names with odd characters, ranges
(``x-ms-range``, as both send them), listing queries and path-style (Azurite) endpoints."""

from __future__ import annotations

import base64
import random
from urllib.parse import quote, urlsplit

import pytest

from concurrent_loader.errors import ConfigError
from concurrent_loader.stores.azure import AzureConfig, sharedkey
from concurrent_loader.stores.azure.sharedkey import API_VERSION, SharedKeySigner

policies = pytest.importorskip(
    "azure.storage.blob._shared.authentication", reason="azure-storage-blob is a dev pin"
)
from azure.core.pipeline import PipelineContext, PipelineRequest  # noqa: E402
from azure.core.pipeline.transport import HttpRequest  # noqa: E402
from azure.storage.blob import BlobClient  # noqa: E402

_rng = random.Random(20261127)
KEYS = [base64.b64encode(_rng.randbytes(64)).decode() for _ in range(3)]
BLOB_NAMES = [
    "plain.bin",
    "dir/sub/file.jpg",
    "a b/c d.txt",
    "odd name+%.bin",
    "ünïcødé/日本語.png",
    "#hash?query&amp=1",
    "~tilde/'quote'/(paren)!*",
    "dir//double/./dot/../x",
    "semi;colon,comma=eq@at$",
]
ENDPOINTS = [
    ("acct", "https://acct.blob.core.windows.net"),
    ("devstoreaccount1", "http://127.0.0.1:10000/devstoreaccount1"),
]
DATE = "Fri, 27 Nov 2026 15:00:00 GMT"


def sdk_authorization(account: str, key: str, url: str, headers: dict[str, str]) -> str:
    request = PipelineRequest(HttpRequest("GET", url, headers=dict(headers)), PipelineContext(None))
    policies.SharedKeyCredentialPolicy(account, key).on_request(request)
    return str(request.http_request.headers["Authorization"])


def origin_of(endpoint: str) -> str:
    parts = urlsplit(endpoint)
    return f"{parts.scheme}://{parts.netloc}"


def ours(account: str, key: str, path: str, query: list[tuple[str, str]], x_ms: dict) -> str:
    signer = SharedKeySigner(account, key)
    text = sharedkey.string_to_sign(account, path, query, list(x_ms.items()))
    return f"SharedKey {account}:{signer.signature(text)}"


@pytest.mark.parametrize("account,endpoint", ENDPOINTS)
@pytest.mark.parametrize("name", BLOB_NAMES)
@pytest.mark.parametrize("key", KEYS)
def test_get_blob_signatures_match_the_sdk(account, endpoint, name, key):
    config = AzureConfig.from_url(
        "az://container-1/", account_name=account, account_key=key, endpoint_url=endpoint
    )
    # The path the store sends is the one the SDK builds for the same blob.
    path = config.container_path() + "/" + quote(name, safe="/~")
    assert path == urlsplit(BlobClient(endpoint, "container-1", name).url).path
    x_ms = {"x-ms-date": DATE, "x-ms-version": API_VERSION}
    assert ours(account, key, path, [], x_ms) == sdk_authorization(
        account, key, origin_of(endpoint) + path, x_ms
    )


@pytest.mark.parametrize("start,end", [(0, 1), (5, 1000), (10**9, 10**9 + 4 * 2**20)])
@pytest.mark.parametrize("account,endpoint", ENDPOINTS)
def test_ranged_get_signatures_match_the_sdk(account, endpoint, start, end, monkeypatch):
    monkeypatch.setattr(sharedkey, "_clock", lambda: 1_795_791_600.0)
    path = urlsplit(endpoint).path + "/c/odd%20name%2B%25.bin"
    x_ms_range = ("x-ms-range", f"bytes={start}-{end - 1}")
    sent = dict([x_ms_range, *SharedKeySigner(account, KEYS[0]).headers(path, [], [x_ms_range])])
    authorization = sent.pop("Authorization")
    assert authorization == sdk_authorization(account, KEYS[0], origin_of(endpoint) + path, sent)


@pytest.mark.parametrize(
    "query",
    [
        [("restype", "container"), ("comp", "list")],
        [("comp", "list"), ("restype", "container"), ("prefix", "images/train/")],
        [("comp", "list"), ("restype", "container"), ("prefix", "a b+c%/ü&=?")],
        [
            ("comp", "list"),
            ("marker", "2!108!MDAwMDQ5IWltYWdlcy90cmFpbi9hcHBsZQ--"),
            ("prefix", "p/"),
            ("restype", "container"),
        ],
    ],
)
@pytest.mark.parametrize("account,endpoint", ENDPOINTS)
def test_list_blobs_signatures_match_the_sdk(account, endpoint, query):
    path = urlsplit(endpoint).path + "/container-1"
    url = origin_of(endpoint) + path + "?" + "&".join(f"{n}={quote(v, safe='')}" for n, v in query)
    x_ms = {"x-ms-date": DATE, "x-ms-version": API_VERSION}
    assert ours(account, KEYS[1], path, query, x_ms) == sdk_authorization(
        account, KEYS[1], url, x_ms
    )


def test_the_headers_it_sends_are_those_it_signs(monkeypatch):
    monkeypatch.setattr(sharedkey, "_clock", lambda: 1_795_791_600.4)
    signer = SharedKeySigner("acct", KEYS[2])
    headers = dict(signer.headers("/c/k", [("comp", "list")]))
    assert headers["x-ms-date"] == "Fri, 27 Nov 2026 15:00:00 GMT"
    assert headers["x-ms-version"] == API_VERSION
    x_ms = {"x-ms-date": headers["x-ms-date"], "x-ms-version": API_VERSION}
    assert headers["Authorization"] == sdk_authorization(
        "acct", KEYS[2], "https://acct.blob.core.windows.net/c/k?comp=list", x_ms
    )


def test_a_key_that_is_not_base64_is_a_config_error_that_does_not_echo_it():
    with pytest.raises(ConfigError) as raised:
        SharedKeySigner("acct", "not base64 at all!")
    assert "not base64 at all" not in str(raised.value)
    assert "acct" in str(raised.value)
    assert KEYS[0] not in repr(SharedKeySigner("acct", KEYS[0]))
