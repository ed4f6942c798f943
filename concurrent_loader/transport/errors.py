"""Where transport failures (HTTP, sockets, TLS) become :mod:`concurrent_loader.errors`:
by exception type, never by message text, always with ``stage`` and the object's ``url``.
What a status means for a store is the store's (:mod:`concurrent_loader.stores.shared`).
"""

from __future__ import annotations

import ssl

from concurrent_loader.errors import (
    BadRequest,
    CertificateRefused,
    ConnectionFailed,
    FetchError,
    FetchTimeout,
    IncompleteBody,
    ObjectTooLarge,
    Reason,
)

from .parser import BodyTooLarge, FramingError, RangeIgnored, UnsupportedEncoding

__all__ = ["certificate_refused", "closed_early", "connect_error", "framing_error", "timed_out"]


def closed_early(url: str, exc: BaseException | None, when: str) -> ConnectionFailed:
    """The connection was closed (``exc`` None) or reset ``when`` (``"before any byte"``)."""
    how, reason = (
        ("closed", Reason.CONNECTION_CLOSED) if exc is None else ("reset", Reason.CONNECTION_RESET)
    )
    error = ConnectionFailed(f"connection {how} {when}", url=url, stage="fetch", cause=reason)
    error.__cause__ = exc
    return error


def incomplete(url: str, detail: str) -> IncompleteBody:
    return IncompleteBody(detail, url=url, stage="fetch", cause=Reason.INCOMPLETE_BODY)


def timed_out(url: str, detail: str, cause: Reason) -> FetchTimeout:
    return FetchTimeout(detail, url=url, stage="fetch", cause=cause)


def malformed(url: str, detail: str) -> ConnectionFailed:
    return ConnectionFailed(detail, url=url, stage="fetch", cause=Reason.MALFORMED_RESPONSE)


def too_large(url: str, detail: str) -> ObjectTooLarge:
    return ObjectTooLarge(detail, url=url, stage="fetch", cause=Reason.OBJECT_TOO_LARGE)


def framing_error(url: str, exc: FramingError) -> FetchError:
    """The error for a response :mod:`.parser` refused."""
    if isinstance(exc, BodyTooLarge):
        return too_large(url, str(exc))
    if isinstance(exc, UnsupportedEncoding):  # not retried, nor a RangeIgnored: both recur
        return FetchError(str(exc), url=url, stage="fetch", cause=Reason.UNSUPPORTED_ENCODING)
    if isinstance(exc, RangeIgnored):
        return BadRequest(
            str(exc), url=url, stage="fetch", cause=Reason.BAD_REQUEST, status=exc.status
        )
    return malformed(url, str(exc))


def certificate_refused(exc: BaseException, url: str, stage: str = "fetch") -> CertificateRefused:
    return CertificateRefused(
        f"{exc}; pass ca_bundle= (or set AWS_CA_BUNDLE) to trust a private CA",
        url=url,
        stage=stage,
        cause=Reason.CERTIFICATE_REFUSED,
    )


def connect_error(exc: BaseException, url: str, timeout: float) -> FetchError:
    """The error for a failed ``connect`` (TCP and TLS handshake) within ``timeout``."""
    if isinstance(exc, FetchError):
        return exc
    if isinstance(exc, ssl.CertificateError):  # SSLCertVerificationError too
        return certificate_refused(exc, url)
    if isinstance(exc, TimeoutError):
        return FetchTimeout(
            f"could not connect within {timeout:g} s",
            url=url,
            stage="fetch",
            cause=Reason.CONNECT_TIMEOUT,
        )
    if isinstance(exc, ssl.SSLError):
        cause = Reason.TLS_FAILED
    elif isinstance(exc, ConnectionRefusedError):
        cause = Reason.CONNECTION_REFUSED
    else:
        cause = Reason.CONNECTION_FAILED
    return ConnectionFailed(str(exc) or type(exc).__name__, url=url, stage="fetch", cause=cause)
