"""What every backend that speaks HTTP shares: the TLS client context, and the one place a
non-2xx status becomes a :mod:`concurrent_loader.errors` class (S3's codes refine it in
:mod:`.s3.errors`, falling back to this table).
"""

from __future__ import annotations

import math
import ssl
from collections.abc import Mapping
from typing import TypeVar

from ..config import FetchConfig
from ..errors import (
    AccessDenied,
    BadRequest,
    BucketNotFound,
    FetchError,
    ObjectNotFound,
    ObjectTooLarge,
    Reason,
    ServerError,
    Throttled,
)

__all__ = ["error_class_for_status", "error_for_status", "fetch_error", "ssl_context_for"]

E = TypeVar("E", bound=FetchError)


def error_class_for_status(status: int) -> type[FetchError]:
    if status in (401, 403):
        return AccessDenied
    if status == 404:
        return ObjectNotFound
    if status in (429, 503):
        return Throttled
    if status >= 500:
        return ServerError
    return BadRequest


def error_for_status(
    status: int,
    url: str,
    *,
    cls: type[FetchError] | None = None,
    code: str | None = None,
    stage: str = "fetch",
) -> FetchError:
    """The error for a failed response: ``cls`` if the backend knows better, else by status."""
    cls = cls or error_class_for_status(status)
    message = f"HTTP {status} {code}" if code else f"HTTP {status}"
    return cls(message, url=url, stage=stage, cause=REASONS[cls], status=status, code=code)


def fetch_error(cls: type[E], message: str, url: str, cause: Reason | None = None) -> E:
    """``cls`` naming the object ``url`` at the fetch stage, with its class's usual cause."""
    return cls(message, url=url, stage="fetch", cause=cause or REASONS[cls])


REASONS: dict[type[FetchError], Reason] = {
    ObjectNotFound: Reason.NOT_FOUND,
    ObjectTooLarge: Reason.OBJECT_TOO_LARGE,
    BucketNotFound: Reason.BUCKET_NOT_FOUND,
    AccessDenied: Reason.ACCESS_DENIED,
    BadRequest: Reason.BAD_REQUEST,
    Throttled: Reason.THROTTLED,
    ServerError: Reason.SERVER_ERROR,
}


def retry_after_seconds(headers: Mapping[str, str]) -> float | None:
    """The delay a ``Retry-After`` header asks for, in seconds; None if absent, a date, or not
    a finite number."""
    value = headers.get("retry-after", "").strip()
    try:
        seconds = float(value)
    except ValueError:
        return None
    return seconds if math.isfinite(seconds) and seconds >= 0 else None


def ssl_context_for(config: FetchConfig, ca_bundle: str | None = None) -> ssl.SSLContext:
    """The client context: the system's trust store, or ``ca_bundle``'s certificates."""
    context = ssl.create_default_context(cafile=ca_bundle)
    if not config.verify_tls:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    return context
