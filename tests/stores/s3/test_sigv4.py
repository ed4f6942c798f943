"""The lean signer must produce botocore's S3 SigV4 headers byte for byte."""

from __future__ import annotations

import datetime
import itertools
from typing import Any
from urllib.parse import urlsplit

import botocore.auth
import botocore.credentials
import botocore.session
import pytest
from botocore.awsrequest import AWSRequest
from botocore.config import Config

from concurrent_loader.errors import ConfigError
from concurrent_loader.stores.s3 import sigv4
from concurrent_loader.stores.s3.sigv4 import EMPTY_SHA256, Credentials, SigV4Signer, encode_s3_path

KEYS = [
    "plain.jpg",
    "with space/and more.jpg",
    "ünïcødé/日本語.png",
    "emoji 😀.bin",
    "a+b=c&d.jpg",
    "tilde~x/under_score-dash.txt",
    "runs//of///slashes/",
    "/leading/slash",
    "percent%20already%2F",
    "star*(paren)!'quote\"",
    "question?mark#hash;semi:colon@at,comma$",
    "dot/./seg/../x",
    "tab\tnew\nline",
]
# (scheme, host as in the URL, the Host header that is sent and signed)
HOSTS = [
    ("http", "127.0.0.1:9000", "127.0.0.1:9000"),
    ("https", "s3.eu-west-1.amazonaws.com", "s3.eu-west-1.amazonaws.com"),
    ("https", "bucket.s3.amazonaws.com:443", "bucket.s3.amazonaws.com"),
    ("http", "minio.local:80", "minio.local"),
    ("http", "[::1]:8333", "[::1]:8333"),
]
CREDENTIALS = [
    Credentials("AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY"),
    Credentials("ASIAEXAMPLE", "secret/with+chars=", token="FQoGZXIvYXdzE//+token=="),
]
FROZEN = datetime.datetime(2024, 2, 29, 23, 59, 58)


def botocore_headers(
    monkeypatch: pytest.MonkeyPatch,
    url: str,
    credentials: Credentials,
    region: str,
    when: datetime.datetime,
) -> dict[str, str]:
    """Sign a bare GET of ``url`` with botocore's S3SigV4Auth at time ``when``."""
    # add_auth takes "now" from botocore.compat.get_current_datetime, imported by name
    # into botocore.auth; freezing it there is what fixes request.context["timestamp"].
    monkeypatch.setattr(botocore.auth, "get_current_datetime", lambda *a, **k: when)
    request = AWSRequest(method="GET", url=url)
    boto_credentials = botocore.credentials.Credentials(
        credentials.access_key, credentials.secret_key, credentials.token
    )
    botocore.auth.S3SigV4Auth(boto_credentials, "s3", region).add_auth(request)
    return {name.lower(): value for name, value in request.headers.items()}


@pytest.mark.parametrize(
    ("scheme", "url_host", "host_header", "credentials"),
    [(*host, credentials) for host, credentials in itertools.product(HOSTS, CREDENTIALS)],
)
def test_matches_botocore(
    monkeypatch: pytest.MonkeyPatch,
    scheme: str,
    url_host: str,
    host_header: str,
    credentials: Credentials,
) -> None:
    signer = SigV4Signer("eu-west-1")
    amz_date = FROZEN.strftime("%Y%m%dT%H%M%SZ")
    for bucket, key in itertools.product(["my-bucket", None], KEYS):
        path = encode_s3_path(bucket, key)
        url = f"{scheme}://{url_host}{path}"
        expected = botocore_headers(monkeypatch, url, credentials, "eu-west-1", FROZEN)
        ours = dict(
            (name.lower(), value)
            for name, value in signer.headers_for_get(
                host_header, path, credentials, amz_date=amz_date
            )
        )
        assert ours == expected, (url, ours, expected)


@pytest.mark.parametrize("addressing_style", ["path", "virtual"])
def test_encode_s3_path_matches_botocore_client(addressing_style: str) -> None:
    """A real botocore client builds the same request path for every key."""
    client = botocore.session.get_session().create_client(
        "s3",
        region_name="us-east-1",
        endpoint_url="http://minio.example:9000",
        aws_access_key_id="AKIDEXAMPLE",
        aws_secret_access_key="secret",
        config=Config(s3={"addressing_style": addressing_style}, retries={"max_attempts": 1}),
    )
    seen: list[str] = []

    class Sent(Exception):
        pass

    def capture(request: Any, **kwargs: Any) -> None:
        seen.append(request.url)
        raise Sent

    client.meta.events.register("before-send.s3.GetObject", capture)
    try:
        for key in KEYS:
            with pytest.raises(Sent):
                client.get_object(Bucket="my-bucket", Key=key)
            url = urlsplit(seen[-1])
            if addressing_style == "path":
                assert url.hostname == "minio.example"
                assert url.path == encode_s3_path("my-bucket", key), key
            else:
                assert url.hostname == "my-bucket.minio.example"
                assert url.path == encode_s3_path(None, key), key
    finally:
        client.close()


def test_key_cache_refreshes_across_midnight(monkeypatch: pytest.MonkeyPatch) -> None:
    signer = SigV4Signer("us-east-1")
    creds = CREDENTIALS[0]
    path = encode_s3_path("b", "k.jpg")
    before = datetime.datetime(2024, 12, 31, 23, 59, 59)
    after = datetime.datetime(2025, 1, 1, 0, 0, 0)
    now = [before.replace(tzinfo=datetime.UTC).timestamp()]
    monkeypatch.setattr(sigv4, "_clock", lambda: now[0])

    first = dict(signer.headers_for_get("h:1", path, creds))
    key_before = signer._day_key
    assert first["x-amz-date"] == "20241231T235959Z"
    # Same second, same day: nothing is recomputed.
    assert dict(signer.headers_for_get("h:1", path, creds)) == first
    assert signer._day_key is key_before

    now[0] += 1
    second = dict(signer.headers_for_get("h:1", path, creds))
    key_after = signer._day_key
    assert second["x-amz-date"] == "20250101T000000Z"
    assert key_after is not key_before
    assert "/20250101/us-east-1/s3/aws4_request" in second["Authorization"]
    for when, ours in ((before, first), (after, second)):
        expected = botocore_headers(monkeypatch, "http://h:1/b/k.jpg", creds, "us-east-1", when)
        assert {k.lower(): v for k, v in ours.items()} == expected

    # An equal but distinct Credentials object reuses the key; a new secret does not.
    signer.headers_for_get("h:1", path, Credentials(creds.access_key, creds.secret_key))
    assert signer._day_key is key_after
    rotated = Credentials(creds.access_key, "rotated-secret")
    signer.headers_for_get("h:1", path, rotated)
    assert signer._day_key is not key_after
    assert signer._day_key is not None
    assert signer._day_key.credentials is rotated


def test_headers_shape() -> None:
    signer = SigV4Signer("us-east-1")
    names = [n for n, _ in signer.headers_for_get("h", "/b/k", CREDENTIALS[1])]
    assert names == ["x-amz-date", "x-amz-content-sha256", "x-amz-security-token", "Authorization"]
    headers = dict(signer.headers_for_get("h", "/b/k", CREDENTIALS[0]))
    assert headers["x-amz-content-sha256"] == EMPTY_SHA256
    assert "x-amz-security-token" not in headers


def test_repr_hides_secrets() -> None:
    creds = Credentials("AKIAIOSFODNN7EXAMPLE", "very-secret-key", token="session-token-value")
    for text in (repr(creds), str(creds), repr([creds])):
        assert "very-secret-key" not in text
        assert "session-token-value" not in text
        assert "IOSFODNN" not in text
        assert "AKIA" in text


def test_bad_arguments() -> None:
    with pytest.raises(ConfigError):
        SigV4Signer("")
    with pytest.raises(ConfigError):
        SigV4Signer("us-east-1").headers_for_get("h", "/", CREDENTIALS[0], amz_date="2024-01-01")
    with pytest.raises(ConfigError):
        encode_s3_path("a/b", "k")
    with pytest.raises(ConfigError):
        encode_s3_path("", "k")
