"""Transport failures become the errors tree by type, with the URL, stage and a Reason."""

from __future__ import annotations

import pickle
import ssl

import pytest

from concurrent_loader.errors import (
    BadRequest,
    CertificateRefused,
    ConnectionFailed,
    FetchError,
    FetchTimeout,
    ObjectTooLarge,
)
from concurrent_loader.transport.errors import (
    closed_early,
    connect_error,
    framing_error,
)
from concurrent_loader.transport.parser import BodyTooLarge, ProtocolError, RangeIgnored

URL = "s3://bucket/key"


@pytest.mark.parametrize(
    ("exc", "cls", "cause"),
    [
        (TimeoutError(), FetchTimeout, "ConnectTimeout"),
        (ssl.SSLError(1, "handshake failure"), ConnectionFailed, "TLSFailed"),
        (ConnectionRefusedError(111, "refused"), ConnectionFailed, "ConnectionRefused"),
        (OSError(113, "no route to host"), ConnectionFailed, "ConnectionFailed"),
    ],
)
def test_connect_errors(exc: BaseException, cls: type[FetchError], cause: str) -> None:
    error = connect_error(exc, URL, 2.5)
    assert type(error) is cls
    assert (error.cause, error.url, error.stage) == (cause, URL, "fetch")
    assert error.retryable
    if cls is FetchTimeout:
        assert "2.5 s" in str(error)


@pytest.mark.parametrize(
    "exc",
    [
        ssl.SSLCertVerificationError(1, "certificate verify failed: self-signed certificate"),
        ssl.CertificateError("hostname 'a' doesn't match 'b'"),
    ],
)
def test_a_refused_certificate_is_not_retried_and_says_what_to_do(exc: BaseException) -> None:
    error = connect_error(exc, URL, 2.5)
    assert type(error) is CertificateRefused
    assert (error.cause, error.url, error.stage) == ("CertificateRefused", URL, "fetch")
    assert not error.retryable
    assert "ca_bundle=" in str(error)


def test_framing_errors() -> None:
    malformed = framing_error(URL, ProtocolError("bad chunk size"))
    assert type(malformed) is ConnectionFailed and malformed.cause == "MalformedResponse"
    assert "bad chunk size" in str(malformed)
    too_large = framing_error(URL, BodyTooLarge("body over max_bytes 10"))
    assert type(too_large) is ObjectTooLarge and not too_large.retryable
    ignored = framing_error(URL, RangeIgnored(200, "got 200"))
    assert type(ignored) is BadRequest and not ignored.retryable
    assert (ignored.cause, ignored.status, ignored.url) == ("BadRequest", 200, URL)


def test_closed_early_names_how_and_survives_pickling() -> None:
    closed = closed_early(URL, None, "before any response byte")
    assert closed.cause == "ConnectionClosed"
    assert "connection closed before any response byte" in str(closed)
    reset = closed_early(URL, ConnectionResetError(104, "reset"), "after 5 body bytes")
    assert reset.cause == "ConnectionReset" and isinstance(reset.__cause__, ConnectionResetError)
    again = pickle.loads(pickle.dumps(reset))
    assert (type(again), again.cause, again.url) == (ConnectionFailed, "ConnectionReset", URL)
