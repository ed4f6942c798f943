"""Origin: the one place an origin and its Host header are computed."""

from __future__ import annotations

import dataclasses

import pytest

from concurrent_loader.errors import ConfigError
from concurrent_loader.transport import Origin


@pytest.mark.parametrize(
    ("url", "scheme", "host", "port", "host_header"),
    [
        ("http://127.0.0.1", "http", "127.0.0.1", 80, "127.0.0.1"),
        ("http://127.0.0.1:80/", "http", "127.0.0.1", 80, "127.0.0.1"),
        ("http://127.0.0.1:9000", "http", "127.0.0.1", 9000, "127.0.0.1:9000"),
        ("https://10.0.0.1", "https", "10.0.0.1", 443, "10.0.0.1"),
        ("https://10.0.0.1:443", "https", "10.0.0.1", 443, "10.0.0.1"),
        ("https://10.0.0.1:80", "https", "10.0.0.1", 80, "10.0.0.1:80"),
        ("http://10.0.0.1:443", "http", "10.0.0.1", 443, "10.0.0.1:443"),
        ("http://[::1]", "http", "::1", 80, "[::1]"),
        ("http://[::1]:9000", "http", "::1", 9000, "[::1]:9000"),
        ("https://[2001:db8::7]/bucket/key?x=1", "https", "2001:db8::7", 443, "[2001:db8::7]"),
        ("https://[2001:db8::7]:8443", "https", "2001:db8::7", 8443, "[2001:db8::7]:8443"),
        ("HTTPS://S3.Example.COM:8443/a", "https", "s3.example.com", 8443, "s3.example.com:8443"),
        ("http://minio:9000/", "http", "minio", 9000, "minio:9000"),
    ],
)
def test_from_url(url: str, scheme: str, host: str, port: int, host_header: str) -> None:
    origin = Origin.from_url(url)
    assert (origin.scheme, origin.host, origin.port) == (scheme, host, port)
    assert origin.host_header == host_header
    assert origin.tls is (scheme == "https")


@pytest.mark.parametrize(
    ("origin", "host_header"),
    [
        (Origin("http", "example.com", 80), "example.com"),
        (Origin("http", "example.com", 8080), "example.com:8080"),
        (Origin("https", "example.com", 443), "example.com"),
        (Origin("http", "::1", 80), "[::1]"),
        (Origin("http", "::1", 9000), "[::1]:9000"),
        (Origin("https", "[fe80::1]", 443), "[fe80::1]"),
    ],
)
def test_host_header(origin: Origin, host_header: str) -> None:
    assert origin.host_header == host_header


def test_ipv6_brackets_are_one_origin() -> None:
    bare, bracketed = Origin("http", "::1", 9000), Origin("http", "[::1]", 9000)
    assert bare == bracketed and hash(bare) == hash(bracketed)
    assert bracketed.host == "::1"
    assert Origin.from_url("http://[::1]:9000") == bare


def test_value_semantics() -> None:
    origin = Origin("https", "example.com", 443)
    assert origin == Origin.from_url("https://example.com/any/path")
    assert origin != Origin("http", "example.com", 443)
    assert {origin: 1}[Origin("https", "example.com", 443)] == 1
    assert repr(origin) == "Origin(scheme='https', host='example.com', port=443)"
    with pytest.raises(dataclasses.FrozenInstanceError):
        origin.port = 80  # type: ignore[misc]
    # replace() recomputes the derived fields.
    assert dataclasses.replace(origin, port=8443).host_header == "example.com:8443"


@pytest.mark.parametrize(
    "url",
    [
        "",
        "127.0.0.1:9000",
        "ftp://127.0.0.1/",
        "s3://bucket/key",
        "http://",
        "http:///path",
        "http://:9000",
        "http://[::1",
        "http://host:99999",
        "http://host:abc",
        "http://host:0",
    ],
)
def test_malformed_urls_are_refused_naming_them(url: str) -> None:
    with pytest.raises(ConfigError) as info:
        Origin.from_url(url)
    assert info.value.cause == "InvalidArgument"
    assert isinstance(info.value, ValueError)
    assert repr(url) in str(info.value)


def test_credentials_in_a_url_are_refused_without_echoing_them() -> None:
    with pytest.raises(ConfigError) as info:
        Origin.from_url("https://user:hunter2-password@example.com/")
    assert info.value.cause == "InvalidArgument"
    assert "hunter2-password" not in str(info.value)


@pytest.mark.parametrize(
    ("scheme", "host", "port"),
    [
        ("ftp", "example.com", 21),
        ("HTTP", "example.com", 80),
        ("http", "", 80),
        ("http", "[]", 80),
        ("http", "exa mple.com", 80),
        ("http", "example.com/path", 80),
        ("http", "user@example.com", 80),
        ("http", "example.com\r\nX-Injected: 1", 80),
        ("http", "a" * 64 + ".example.com", 80),  # a label over 63 characters
        ("http", "example..com", 80),  # an empty label
        ("http", "example.com", 0),
        ("http", "example.com", 65536),
        ("http", "example.com", True),
        ("http", "example.com", "80"),
    ],
)
def test_invalid_fields_are_refused(scheme: str, host: str, port: int) -> None:
    with pytest.raises(ConfigError) as info:
        Origin(scheme, host, port)
    assert info.value.cause == "InvalidArgument"


def test_from_url_needs_a_string() -> None:
    with pytest.raises(ConfigError):
        Origin.from_url(b"http://example.com")  # type: ignore[arg-type]
