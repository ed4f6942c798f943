"""Azure's error codes and statuses -> the error tree, by code then status, naming the
object, with the service's code in the message."""

from __future__ import annotations

import pytest

from concurrent_loader.errors import (
    AccessDenied,
    BadRequest,
    BucketNotFound,
    ObjectNotFound,
    ServerError,
    Throttled,
)
from concurrent_loader.stores.azure.errors import error_for_response

URL = "az://container/prefix/key.jpg"
XML = b'<?xml version="1.0" encoding="utf-8"?><Error><Code>%s</Code><Message>m</Message></Error>'


@pytest.mark.parametrize(
    "status,code,in_body,cls,retryable",
    [
        (404, "BlobNotFound", False, ObjectNotFound, False),
        (404, "ContainerNotFound", False, BucketNotFound, False),
        (403, "AuthenticationFailed", False, AccessDenied, False),
        (403, "AuthorizationPermissionMismatch", True, AccessDenied, False),
        (503, "ServerBusy", False, Throttled, True),
        (500, "OperationTimedOut", False, Throttled, True),
        (500, "InternalError", True, ServerError, True),
        (416, "InvalidRange", False, BadRequest, False),
        (400, "ServerBusy", False, BadRequest, False),  # a throttle code on a 4xx is not one
        (503, None, False, Throttled, True),  # no code: by status
        (502, None, False, ServerError, True),
        (404, "SomethingNew", False, ObjectNotFound, False),
    ],
)
def test_codes_and_statuses_become_their_error_class(status, code, in_body, cls, retryable):
    headers = {} if in_body or code is None else {"x-ms-error-code": code}
    body = XML % code.encode() if in_body and code else b""
    error = error_for_response(status, headers, body, URL)
    assert type(error) is cls and error.retryable is retryable
    assert error.url == URL and error.status == status and error.code == code
    assert URL in str(error) and (code or str(status)) in str(error)


def test_a_throttle_says_when_the_service_asked_to_retry():
    error = error_for_response(503, {"x-ms-error-code": "ServerBusy", "retry-after": "7"}, b"", URL)
    assert isinstance(error, Throttled)
    assert error.retry_after == 7.0  # the retry layer waits at least this long
