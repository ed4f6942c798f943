"""Where a store's answers become :mod:`concurrent_loader.errors`: HTTP statuses, S3's
error documents and botocore's exceptions.

Translation is by type and HTTP status (and, for S3, the machine-readable ``<Code>`` of the
error document or botocore's parsed error code), never by matching message text. Failures
of the HTTP exchange itself (sockets, TLS, timeouts, aiohttp) are translated by
:mod:`concurrent_loader.transport.errors`, which this defers to for anything not botocore's.
"""

from __future__ import annotations

import re

from ..errors import (
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
from ..transport import errors as transport_errors

__all__ = ["error_for_code", "error_for_exception", "error_for_status"]

_CODE_RE = re.compile(rb"<Code>([^<]{1,64})</Code>")

_BY_CODE: dict[str, type[FetchError]] = {
    "NoSuchKey": ObjectNotFound,
    "NotFound": ObjectNotFound,
    "NoSuchBucket": BucketNotFound,
    "AccessDenied": AccessDenied,
    "InvalidAccessKeyId": AccessDenied,
    "SignatureDoesNotMatch": AccessDenied,
    "ExpiredToken": AccessDenied,
    "InvalidToken": AccessDenied,
    "AllAccessDisabled": AccessDenied,
    "SlowDown": Throttled,
    "Throttling": Throttled,
    "ThrottlingException": Throttled,
    "RequestLimitExceeded": Throttled,
    "TooManyRequests": Throttled,
}


_REASONS: dict[type[FetchError], Reason] = {
    ObjectNotFound: Reason.NOT_FOUND,
    BucketNotFound: Reason.BUCKET_NOT_FOUND,
    AccessDenied: Reason.ACCESS_DENIED,
    BadRequest: Reason.BAD_REQUEST,
    Throttled: Reason.THROTTLED,
    ServerError: Reason.SERVER_ERROR,
}


def _class_for_status(status: int) -> type[FetchError]:
    if status in (401, 403):
        return AccessDenied
    if status == 404:
        return ObjectNotFound
    if status in (429, 503):
        return Throttled
    if status >= 500:
        return ServerError
    return BadRequest


def error_for_code(code: str | None, status: int, url: str, *, stage: str = "fetch") -> FetchError:
    """Error for an S3 error ``code`` (e.g. ``NoSuchKey``) and HTTP ``status``."""
    cls = _BY_CODE.get(code or "") or _class_for_status(status)
    if cls is Throttled and status < 500 and status != 429:
        cls = BadRequest
    message = f"HTTP {status} {code}" if code else f"HTTP {status}"
    return cls(message, url=url, stage=stage, cause=_REASONS[cls], status=status, code=code)


def error_for_status(status: int, body: bytes | bytearray, url: str) -> FetchError:
    """Error for a non-2xx GET response whose (possibly XML) body is ``body``."""
    match = _CODE_RE.search(bytes(body[:4096]))
    code = match.group(1).decode("ascii", "replace") if match else None
    return error_for_code(code, status, url)


def error_for_exception(exc: BaseException, url: str, *, stage: str = "fetch") -> FetchError:
    """Error for an exception raised by botocore, aiohttp or the OS during a request."""
    if isinstance(exc, FetchError):
        return exc
    try:  # botocore's parsed S3 error, from the control plane (listing)
        from botocore.exceptions import ClientError

        if isinstance(exc, ClientError):
            error = exc.response.get("Error", {})
            status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
            return error_for_code(error.get("Code"), status or 400, url, stage=stage)
    except ImportError:  # pragma: no cover - botocore is a dependency
        pass
    try:
        from botocore.exceptions import (
            ConnectTimeoutError,
            EndpointConnectionError,
            NoCredentialsError,
            ReadTimeoutError,
        )

        if isinstance(exc, (ConnectTimeoutError, ReadTimeoutError)):
            return FetchTimeout(str(exc), url=url, stage=stage, cause=Reason.TIMED_OUT)
        if isinstance(exc, EndpointConnectionError):
            return ConnectionFailed(str(exc), url=url, stage=stage, cause=Reason.CONNECTION_FAILED)
        if isinstance(exc, NoCredentialsError):
            return AccessDenied(
                "no AWS credentials found (env vars, profile, instance role); pass "
                "anonymous=True for a public bucket",
                url=url,
                stage=stage,
                cause=Reason.NO_CREDENTIALS,
            )
    except ImportError:  # pragma: no cover
        pass
    return transport_errors.error_for_exception(exc, url, stage=stage)
