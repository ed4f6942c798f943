"""GCS's answers and google-auth's exceptions -> :mod:`concurrent_loader.errors`, by HTTP
status and the service's ``reason`` (never by message text); the service's reason and
message go into the error's message, the reason into ``code``.

A JSON API error body is ``{"error": {"code": 404, "message": "...", "errors": [{"reason":
"notFound", ...}]}}``; a media download may answer in plain text instead (the first line is
kept). ``429`` and ``503`` are :class:`~concurrent_loader.errors.Throttled` carrying the
``Retry-After`` the service sent (seconds; an HTTP date is not used by GCS).
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from ...errors import (
    AccessDenied,
    BadRequest,
    ConnectionFailed,
    FetchError,
    Reason,
    Throttled,
)
from ..shared import REASONS, error_class_for_status, retry_after_seconds

__all__ = ["error_for_auth", "error_for_response", "no_credentials"]

#: the longest service message kept in an error
_MESSAGE_CHARS = 300

_BY_REASON: dict[str, type[FetchError]] = {
    "rateLimitExceeded": Throttled,
    "userRateLimitExceeded": Throttled,
    "forbidden": AccessDenied,
    "accessDenied": AccessDenied,
    "authError": AccessDenied,
    "required": AccessDenied,
}


def _service_error(body: bytes | bytearray) -> tuple[str | None, str]:
    """The service's (reason, message) from a JSON error body, or (None, its first line)."""
    head = bytes(body[:8192])
    try:
        error = json.loads(head)["error"]
        reasons = [item.get("reason") for item in error.get("errors", ())]
        reason = next((r for r in reasons if isinstance(r, str) and r), None)
        message = str(error.get("message", ""))
    except (ValueError, TypeError, KeyError, AttributeError):
        reason = None
        message = head.decode("utf-8", "replace").strip().split("\n", 1)[0]
    return reason, message[:_MESSAGE_CHARS]


def error_for_response(
    status: int,
    headers: Mapping[str, str],
    body: bytes | bytearray,
    url: str,
    *,
    stage: str = "fetch",
) -> FetchError:
    """The error for a non-2xx GCS answer about ``url`` (``gs://bucket/key``)."""
    reason, message = _service_error(body)
    cls = error_class_for_status(status)
    if status not in (404, 429, 503):  # the status decides these; the reason refines others
        cls = _BY_REASON.get(reason or "", cls)
    if cls is Throttled and status != 429 and status < 500:
        cls = BadRequest
    text = f"HTTP {status} {reason}" if reason else f"HTTP {status}"
    if message and message != reason:
        text += f": {message}"
    error = cls(text, url=url, stage=stage, cause=REASONS[cls], status=status, code=reason)
    if isinstance(error, Throttled):
        error.retry_after = retry_after_seconds(headers)
    return error


def no_credentials(url: str, detail: str, stage: str = "fetch") -> AccessDenied:
    return AccessDenied(
        f"no Google credentials found ({detail}); set up Application Default Credentials "
        "(gcloud auth application-default login, GOOGLE_APPLICATION_CREDENTIALS, or the "
        "metadata server), or pass anonymous=True to read a public bucket",
        url=url,
        stage=stage,
        cause=Reason.NO_CREDENTIALS,
    )


def error_for_auth(exc: BaseException, url: str) -> FetchError:
    """The error for google-auth failing to load or refresh credentials, by type."""
    from google.auth import exceptions

    if isinstance(exc, FetchError):
        return exc
    if isinstance(exc, exceptions.DefaultCredentialsError):
        return no_credentials(url, type(exc).__name__)
    if isinstance(exc, exceptions.TransportError):  # the token endpoint unreachable
        return ConnectionFailed(
            f"refreshing the Google access token failed: {type(exc).__name__}",
            url=url,
            stage="fetch",
            cause=Reason.CONNECTION_FAILED,
        )
    # RefreshError and the rest: the credentials were refused. Their text may quote the
    # token endpoint's answer but never a token; the type is enough here.
    return AccessDenied(
        f"refreshing the Google access token failed: {type(exc).__name__}",
        url=url,
        stage="fetch",
        cause=Reason.ACCESS_DENIED,
    )
