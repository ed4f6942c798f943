"""Azure Storage's error codes -> :mod:`concurrent_loader.errors`, by the ``x-ms-error-code``
header (or the XML body's ``<Code>`` when the header is missing) and the HTTP status, never by
message text; unlisted codes fall back to :mod:`concurrent_loader.stores.shared`. The
service's code is the error's ``code`` and is in its message.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from ...errors import (
    AccessDenied,
    BadRequest,
    BucketNotFound,
    FetchError,
    ObjectNotFound,
    ServerError,
    Throttled,
)
from ..shared import error_class_for_status, error_for_status, retry_after_seconds

__all__ = ["error_for_response"]

_CODE_RE = re.compile(rb"<Code>([^<]{1,64})</Code>")

_BY_CODE: dict[str, type[FetchError]] = {
    "BlobNotFound": ObjectNotFound,
    "ResourceNotFound": ObjectNotFound,
    "ContainerNotFound": BucketNotFound,
    "ContainerBeingDeleted": BucketNotFound,
    "AuthenticationFailed": AccessDenied,
    "AuthorizationFailure": AccessDenied,
    "AuthorizationPermissionMismatch": AccessDenied,
    "AuthorizationResourceTypeMismatch": AccessDenied,
    "AuthorizationSourceIPMismatch": AccessDenied,
    "AuthorizationProtocolMismatch": AccessDenied,
    "InsufficientAccountPermissions": AccessDenied,
    "InvalidAuthenticationInfo": AccessDenied,
    "NoAuthenticationInformation": AccessDenied,
    "AccountIsDisabled": AccessDenied,
    "PublicAccessNotPermitted": AccessDenied,
    "ServerBusy": Throttled,
    "OperationTimedOut": Throttled,
    "TooManyRequests": Throttled,
    "InternalError": ServerError,
    "InvalidRange": BadRequest,
}


def error_for_response(
    status: int,
    headers: Mapping[str, str],
    body: bytes | bytearray,
    url: str,
    *,
    stage: str = "fetch",
) -> FetchError:
    """The error for a failed Azure response: by its code, else by ``status``."""
    code = headers.get("x-ms-error-code")
    if not code:
        match = _CODE_RE.search(bytes(body[:4096]))
        code = match.group(1).decode("ascii", "replace") if match else None
    cls = _BY_CODE.get(code or "") or error_class_for_status(status)
    if cls is Throttled and status < 500 and status != 429:
        cls = BadRequest  # a throttling code on a 4xx is not the service asking to slow down
    error = error_for_status(status, url, cls=cls, code=code, stage=stage)
    if isinstance(error, Throttled):
        error.retry_after = retry_after_seconds(headers)
    return error
