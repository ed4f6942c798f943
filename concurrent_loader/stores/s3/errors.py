"""S3's error codes and botocore's exceptions -> :mod:`concurrent_loader.errors`, by the
``<Code>`` and HTTP status, never by message text; unlisted codes fall back to
:mod:`concurrent_loader.stores.shared`.
"""

from __future__ import annotations

import re
import ssl

from ...errors import (
    AccessDenied,
    BadRequest,
    BucketNotFound,
    ConnectionFailed,
    FetchError,
    FetchTimeout,
    ObjectNotFound,
    Reason,
    Throttled,
)
from ...transport.errors import certificate_refused
from ..shared import error_class_for_status, error_for_status

__all__ = ["error_for_code", "error_for_exception", "error_for_response", "refused_certificate"]

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


def error_for_code(code: str | None, status: int, url: str, *, stage: str = "fetch") -> FetchError:
    """Error for an S3 error ``code`` (e.g. ``NoSuchKey``) and HTTP ``status``."""
    cls = _BY_CODE.get(code or "") or error_class_for_status(status)
    if cls is Throttled and status < 500 and status != 429:
        cls = BadRequest
    return error_for_status(status, url, cls=cls, code=code, stage=stage)


def error_for_response(status: int, body: bytes | bytearray, url: str) -> FetchError:
    """Error for a non-2xx GET response whose (possibly XML) body is ``body``."""
    match = _CODE_RE.search(bytes(body[:4096]))
    code = match.group(1).decode("ascii", "replace") if match else None
    return error_for_code(code, status, url)


def error_for_exception(exc: BaseException, url: str, *, stage: str = "list") -> FetchError:
    """Error for an exception raised by aiobotocore / botocore (the control plane)."""
    from aiohttp import ClientError as AiohttpError
    from botocore.exceptions import (
        ClientError,
        ConnectionClosedError,
        ConnectTimeoutError,
        EndpointConnectionError,
        NoCredentialsError,
        ReadTimeoutError,
        SSLError,
    )

    if isinstance(exc, FetchError):
        return exc
    if isinstance(exc, ClientError):
        error = exc.response.get("Error", {})
        status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
        return error_for_code(error.get("Code"), status or 400, url, stage=stage)
    if isinstance(exc, (ConnectTimeoutError, ReadTimeoutError, TimeoutError)):
        return FetchTimeout(str(exc), url=url, stage=stage, cause=Reason.TIMED_OUT)
    if isinstance(exc, NoCredentialsError):
        return no_credentials(url, stage)
    if isinstance(exc, SSLError) and refused_certificate(exc):  # not transient
        return certificate_refused(exc, url, stage)
    if isinstance(exc, ConnectionClosedError):
        return ConnectionFailed(str(exc), url=url, stage=stage, cause=Reason.CONNECTION_CLOSED)
    if isinstance(exc, (EndpointConnectionError, ConnectionError, OSError, AiohttpError)):
        return ConnectionFailed(str(exc), url=url, stage=stage, cause=Reason.CONNECTION_FAILED)
    return FetchError(repr(exc), url=url, stage=stage, cause=Reason.UNKNOWN)


def no_credentials(url: str, stage: str = "fetch") -> AccessDenied:
    return AccessDenied(
        "no AWS credentials found (env vars, profile, instance role); pass "
        "anonymous=True to read a public bucket",
        url=url,
        stage=stage,
        cause=Reason.NO_CREDENTIALS,
    )


def refused_certificate(exc: BaseException) -> bool:
    """Whether ``exc`` (botocore's ``SSLError``) wraps a refused certificate, by type."""
    seen: set[int] = set()
    pending: list[object] = [exc]
    while pending:
        item = pending.pop()
        if not isinstance(item, BaseException) or id(item) in seen:
            continue
        seen.add(id(item))
        if isinstance(item, ssl.CertificateError):
            return True
        kwargs = getattr(item, "kwargs", None)
        if isinstance(kwargs, dict):
            pending.append(kwargs.get("error"))
        pending += [item.__cause__, item.__context__, getattr(item, "certificate_error", None)]
    return False
