"""Failures -> the error tree, by HTTP status, S3 error code and botocore exception type.

Every error produced here must name its object, carry a :class:`Reason`, keep the status and
the server's code apart, and survive pickling with all of that.
"""

from __future__ import annotations

import pickle

import aiohttp
import pytest
from botocore.exceptions import (
    ClientError,
    ConnectionClosedError,
    ConnectTimeoutError,
    EndpointConnectionError,
    NoCredentialsError,
    ReadTimeoutError,
)

from concurrent_loader.errors import (
    AccessDenied,
    BadRequest,
    BucketNotFound,
    ConnectionFailed,
    FetchError,
    FetchTimeout,
    ObjectNotFound,
    Reason,
    ServerError,
    Throttled,
)
from concurrent_loader.stores.s3.errors import (
    error_for_code,
    error_for_exception,
    error_for_response,
)
from concurrent_loader.stores.shared import error_for_status

URL = "s3://bucket/dir/key.jpg"


def check_well_formed(error: FetchError, *, stage: str = "fetch") -> None:
    """What every translated error promises, including after a pickle round trip."""
    assert error.url == URL
    assert isinstance(error.cause, Reason)
    assert error.stage == stage
    assert URL in str(error)
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is type(error)
    assert (copy.url, copy.cause, copy.stage, copy.status, copy.code) == (
        error.url,
        error.cause,
        error.stage,
        error.status,
        error.code,
    )
    assert str(copy) == str(error)


@pytest.mark.parametrize(
    ("status", "cls", "reason"),
    [
        (400, BadRequest, Reason.BAD_REQUEST),
        (401, AccessDenied, Reason.ACCESS_DENIED),
        (403, AccessDenied, Reason.ACCESS_DENIED),
        (404, ObjectNotFound, Reason.NOT_FOUND),
        (405, BadRequest, Reason.BAD_REQUEST),
        (409, BadRequest, Reason.BAD_REQUEST),
        (412, BadRequest, Reason.BAD_REQUEST),
        (416, BadRequest, Reason.BAD_REQUEST),
        (429, Throttled, Reason.THROTTLED),
        (500, ServerError, Reason.SERVER_ERROR),
        (501, ServerError, Reason.SERVER_ERROR),
        (502, ServerError, Reason.SERVER_ERROR),
        (503, Throttled, Reason.THROTTLED),
        (504, ServerError, Reason.SERVER_ERROR),
    ],
)
def test_status_table(status, cls, reason):
    error = error_for_status(status, URL)
    assert type(error) is cls
    assert error.cause is reason
    assert error.status == status and error.code is None
    assert error.retryable is (cls in (Throttled, ServerError))
    check_well_formed(error)


def test_status_with_a_class_the_backend_knows_better():
    error = error_for_status(404, URL, cls=BucketNotFound, code="NoSuchBucket", stage="list")
    assert type(error) is BucketNotFound and error.cause is Reason.BUCKET_NOT_FOUND
    assert error.code == "NoSuchBucket" and "HTTP 404 NoSuchBucket" in str(error)
    check_well_formed(error, stage="list")


@pytest.mark.parametrize(
    ("code", "status", "cls", "reason"),
    [
        ("NoSuchKey", 404, ObjectNotFound, Reason.NOT_FOUND),
        ("NotFound", 404, ObjectNotFound, Reason.NOT_FOUND),
        ("NoSuchBucket", 404, BucketNotFound, Reason.BUCKET_NOT_FOUND),
        ("AccessDenied", 403, AccessDenied, Reason.ACCESS_DENIED),
        ("InvalidAccessKeyId", 403, AccessDenied, Reason.ACCESS_DENIED),
        ("SignatureDoesNotMatch", 403, AccessDenied, Reason.ACCESS_DENIED),
        ("ExpiredToken", 400, AccessDenied, Reason.ACCESS_DENIED),
        ("InvalidToken", 400, AccessDenied, Reason.ACCESS_DENIED),
        ("AllAccessDisabled", 403, AccessDenied, Reason.ACCESS_DENIED),
        ("SlowDown", 503, Throttled, Reason.THROTTLED),
        ("TooManyRequests", 429, Throttled, Reason.THROTTLED),
        ("Throttling", 503, Throttled, Reason.THROTTLED),
        # a throttling code on a 4xx other than 429 is not a throttle: nothing to retry
        ("SlowDown", 400, BadRequest, Reason.BAD_REQUEST),
        ("RequestLimitExceeded", 403, BadRequest, Reason.BAD_REQUEST),
        # codes not in the table fall back to the status
        ("InternalError", 500, ServerError, Reason.SERVER_ERROR),
        ("ServiceUnavailable", 503, Throttled, Reason.THROTTLED),
        ("InvalidRange", 416, BadRequest, Reason.BAD_REQUEST),
        ("SomethingNew", 404, ObjectNotFound, Reason.NOT_FOUND),
        (None, 502, ServerError, Reason.SERVER_ERROR),
    ],
)
def test_s3_code_table(code, status, cls, reason):
    error = error_for_code(code, status, URL)
    assert type(error) is cls
    assert error.cause is reason
    assert (error.status, error.code) == (status, code)
    check_well_formed(error)


def s3_error_document(code: str) -> bytes:
    return (
        b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>'
        + code.encode()
        + b"</Code><Message>The specified key does not exist.</Message>"
        b"<Key>dir/key.jpg</Key><RequestId>4442587FB7D0A2F9</RequestId></Error>"
    )


@pytest.mark.parametrize(
    ("status", "body", "cls", "code"),
    [
        (404, s3_error_document("NoSuchKey"), ObjectNotFound, "NoSuchKey"),
        (404, s3_error_document("NoSuchBucket"), BucketNotFound, "NoSuchBucket"),
        (403, s3_error_document("SignatureDoesNotMatch"), AccessDenied, "SignatureDoesNotMatch"),
        (503, s3_error_document("SlowDown"), Throttled, "SlowDown"),
        (400, s3_error_document("SlowDown"), BadRequest, "SlowDown"),
        (403, b"", AccessDenied, None),  # HEAD-like: no body
        (502, b"<html><body>Bad Gateway</body></html>", ServerError, None),  # a proxy's page
        (404, bytearray(s3_error_document("NoSuchKey")), ObjectNotFound, "NoSuchKey"),
    ],
)
def test_error_documents_are_read_for_their_code(status, body, cls, code):
    error = error_for_response(status, body, URL)
    assert type(error) is cls and error.code == code and error.status == status
    check_well_formed(error)


def test_a_code_beyond_the_first_4_kib_is_not_looked_for():
    body = b" " * 4096 + s3_error_document("NoSuchBucket")
    error = error_for_response(404, body, URL)
    assert type(error) is ObjectNotFound and error.code is None


def client_error(code: str | None, status: int | None) -> ClientError:
    response: dict = {"Error": {"Message": "message"}}
    if code is not None:
        response["Error"]["Code"] = code
    if status is not None:
        response["ResponseMetadata"] = {"HTTPStatusCode": status}
    return ClientError(response, "ListObjectsV2")


@pytest.mark.parametrize(
    ("exc", "cls", "reason"),
    [
        (client_error("NoSuchBucket", 404), BucketNotFound, Reason.BUCKET_NOT_FOUND),
        (client_error("AccessDenied", 403), AccessDenied, Reason.ACCESS_DENIED),
        (client_error("SlowDown", 503), Throttled, Reason.THROTTLED),
        (client_error("InternalError", 500), ServerError, Reason.SERVER_ERROR),
        (client_error("InvalidArgument", None), BadRequest, Reason.BAD_REQUEST),  # no status
        (client_error(None, 404), ObjectNotFound, Reason.NOT_FOUND),
        (NoCredentialsError(), AccessDenied, Reason.NO_CREDENTIALS),
        (ConnectTimeoutError(endpoint_url="https://s3"), FetchTimeout, Reason.TIMED_OUT),
        (ReadTimeoutError(endpoint_url="https://s3"), FetchTimeout, Reason.TIMED_OUT),
        (TimeoutError("slow"), FetchTimeout, Reason.TIMED_OUT),
        (
            EndpointConnectionError(endpoint_url="https://s3"),
            ConnectionFailed,
            Reason.CONNECTION_FAILED,
        ),
        (ConnectionResetError("reset"), ConnectionFailed, Reason.CONNECTION_FAILED),
        (OSError("unreachable"), ConnectionFailed, Reason.CONNECTION_FAILED),
        (aiohttp.ClientPayloadError("short"), ConnectionFailed, Reason.CONNECTION_FAILED),
        (ValueError("odd"), FetchError, Reason.UNKNOWN),
    ],
    ids=lambda value: type(value).__name__ if isinstance(value, BaseException) else None,
)
def test_botocore_exceptions(exc, cls, reason):
    error = error_for_exception(exc, URL)
    assert type(error) is cls and error.cause is reason
    check_well_formed(error, stage="list")


def test_client_error_keeps_the_code_and_status():
    error = error_for_exception(client_error("NoSuchBucket", 404), URL, stage="fetch")
    assert (error.code, error.status, error.stage) == ("NoSuchBucket", 404, "fetch")


def test_no_credentials_says_what_to_do():
    assert "anonymous=True" in str(error_for_exception(NoCredentialsError(), URL))


def test_our_own_errors_pass_through_unchanged():
    ours = ObjectNotFound("x", url=URL, stage="fetch", cause=Reason.NOT_FOUND)
    assert error_for_exception(ours, "s3://other/url") is ours


def test_a_connection_closed_by_the_server_is_connection_failed():
    exc = ConnectionClosedError(endpoint_url="https://s3", error="disconnected", request=None)
    error = error_for_exception(exc, URL)
    assert type(error) is ConnectionFailed and error.retryable
    assert error.cause is Reason.CONNECTION_CLOSED
