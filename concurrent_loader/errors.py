"""Every error the loader raises, in one tree.

::

    LoaderError                      anything this library raises on purpose
    ├── ConfigError (ValueError)     bad argument, malformed URL, unknown scheme, empty prefix
    ├── FetchError                   the object could not be read
    │   ├── ObjectNotFound           404 / NoSuchKey / missing file          (not retried)
    │   ├── BucketNotFound           404 / NoSuchBucket                      (not retried)
    │   ├── AccessDenied             401 / 403, bad credentials, signature   (not retried)
    │   ├── BadRequest               other 4xx                               (not retried)
    │   ├── ObjectTooLarge           larger than ``max_object_bytes``        (not retried)
    │   ├── Throttled                503 SlowDown / 429                      (retried)
    │   ├── ServerError              other 5xx                               (retried)
    │   ├── ConnectionFailed         refused / reset / closed early          (retried)
    │   ├── CertificateRefused       server certificate not trusted / wrong host (not retried)
    │   ├── IncompleteBody           fewer bytes than Content-Length         (retried)
    │   ├── IntegrityError           the body does not match the store's checksum (retried)
    │   └── FetchTimeout (TimeoutError) connect / first byte / read stall / attempt (retried);
    │                                    the object's whole time budget spent (final)
    ├── DecodeError                  the bytes arrived but are not a valid sample
    │   └── ShardError               a tar shard, its index or a member is not as expected
    ├── SkipBudgetExceeded           ``on_error="skip"`` went over ``max_skipped``
    ├── LoaderStalled (TimeoutError) no batch for ``stall_timeout_s``; says what waited on what
    └── WorkerError                  a worker process died without raising

Backend exceptions are translated by type and status, never by message text. Every error
names its object, stage and :class:`Reason` (the server's own code in ``code``), keeps the
original as ``__cause__``, survives pickling from a worker, and can be built from one message
string (as ``DataLoader`` re-raises a worker's exception).
"""

from __future__ import annotations

import copy
from enum import StrEnum
from typing import Any

__all__ = ["AccessDenied", "BadRequest", "BucketNotFound", "CertificateRefused", "ConfigError"]
__all__ += ["ConnectionFailed", "DecodeError", "FetchError", "FetchTimeout", "IncompleteBody"]
__all__ += ["IntegrityError", "LoaderError", "LoaderStalled", "ObjectNotFound", "ObjectTooLarge"]
__all__ += ["Reason", "ServerError", "ShardError", "SkipBudgetExceeded", "Throttled", "WorkerError"]


class Reason(StrEnum):
    """The fixed set of ``LoaderError.cause`` values (``error.cause == "NotFound"``)."""

    # the object or its container
    NOT_FOUND = "NotFound"
    BUCKET_NOT_FOUND = "BucketNotFound"
    ACCESS_DENIED = "AccessDenied"
    NO_CREDENTIALS = "NoCredentials"
    BAD_REQUEST = "BadRequest"
    WRONG_REGION = "WrongRegion"
    OBJECT_TOO_LARGE = "ObjectTooLarge"
    # the store or the network (transient)
    THROTTLED = "Throttled"
    SERVER_ERROR = "ServerError"
    CONNECTION_REFUSED = "ConnectionRefused"
    CONNECTION_RESET = "ConnectionReset"
    CONNECTION_CLOSED = "ConnectionClosed"
    CONNECTION_FAILED = "ConnectionFailed"
    MALFORMED_RESPONSE = "MalformedResponse"
    UNSUPPORTED_ENCODING = "UnsupportedEncoding"
    INCOMPLETE_BODY = "IncompleteBody"
    CHECKSUM_MISMATCH = "ChecksumMismatch"
    OBJECT_CHANGED = "ObjectChanged"
    CONNECT_TIMEOUT = "ConnectTimeout"
    FIRST_BYTE_TIMEOUT = "FirstByteTimeout"
    READ_TIMEOUT = "ReadTimeout"
    TIMED_OUT = "TimedOut"
    ATTEMPT_TIMEOUT = "AttemptTimeout"
    DEADLINE_EXCEEDED = "DeadlineExceeded"
    TLS_FAILED = "TLSFailed"
    CERTIFICATE_REFUSED = "CertificateRefused"
    PROXY_REFUSED = "ProxyRefused"
    # the bytes
    EMPTY_OBJECT = "EmptyObject"
    UNDECODABLE = "Undecodable"
    DECOMPRESSION_BOMB = "DecompressionBomb"
    # tar shards
    NOT_A_TAR = "NotATar"
    TRUNCATED_SHARD = "TruncatedShard"
    MISSING_MEMBER = "MissingMember"
    INDEX_MISMATCH = "IndexMismatch"
    # the configuration
    INVALID_ARGUMENT = "InvalidArgument"
    EMPTY_PREFIX = "EmptyPrefix"
    # the loader
    SKIP_BUDGET_EXCEEDED = "SkipBudgetExceeded"
    STALLED = "Stalled"
    WORKER_DIED = "WorkerDied"
    UNKNOWN = "Unknown"


class LoaderError(Exception):
    """Base of every error raised on purpose by concurrent_loader.

    ``url`` names the object (``s3://bucket/key``, ``https://...`` or a local path),
    ``stage`` the pipeline stage that failed (``"fetch"``, ``"decode"``, ...), ``cause`` is a
    :class:`Reason`, ``status`` the HTTP status and ``code`` the server's error code
    (``"NoSuchKey"``, ``"SlowDown"``) when there was one.
    """

    #: whether retrying the same request may succeed
    retryable: bool = False
    #: the ``cause`` when none is given (not repeated in a message without ``url``)
    default_cause: Reason | None = None

    def __init__(
        self,
        message: str = "",
        *,
        url: str | None = None,
        stage: str | None = None,
        cause: Reason | str | None = None,
        status: int | None = None,
        code: str | None = None,
    ) -> None:
        self.message = message
        self.url = url
        self.stage = stage
        self.cause: Reason | None = Reason(cause) if cause is not None else self.default_cause
        self.status = status
        self.code = code
        super().__init__(self._render())

    def _render(self) -> str:
        if self.url is None and self.cause in (None, self.default_cause):
            return self.message
        head = f"{self.cause or type(self).__name__}: {self.url}" if self.url else self.cause
        parts = [p for p in (head, self.message) if p]
        text = " - ".join(parts)
        if self.stage:
            text += f" (stage: {self.stage})"
        return text

    def for_object(self, url: str, part: str | None = None) -> LoaderError:
        """A copy of this error naming ``url`` (for errors raised before the object was known)
        and, first in its message, ``part``, the part of the object (a shard's sample)."""
        named = copy.copy(self)
        state = {**self.__dict__, "url": url}
        if part is not None:
            state["message"] = f"{part}: {self.message}" if self.message else part
        if "__notes__" in state:  # the copy's notes are its own
            state["__notes__"] = list(state["__notes__"])
        named.__setstate__(state)
        named.__cause__ = self.__cause__
        return named

    def __reduce__(self) -> tuple[Any, ...]:
        # Rebuilt from its message, then its attributes (url, cause, ..., notes) and text.
        return (type(self), (self.message,), self.__dict__)

    def __setstate__(self, state: dict[str, Any] | None) -> None:
        self.__dict__.update(state or {})
        self.args = (self._render(),)


class ConfigError(LoaderError, ValueError):
    """A bad argument: malformed URL, unknown scheme, empty prefix, invalid option."""

    default_cause = Reason.INVALID_ARGUMENT


class FetchError(LoaderError):
    """The object's bytes could not be read."""


class ObjectNotFound(FetchError):
    """The key (or file) does not exist."""


class BucketNotFound(FetchError):
    """The bucket does not exist."""


class AccessDenied(FetchError):
    """The credentials were refused, or do not allow reading the object."""


class BadRequest(FetchError):
    """The server rejected the request (a 4xx other than 401/403/404/429)."""


class ObjectTooLarge(FetchError):
    """The object is larger than the configured ``max_object_bytes``."""


class Throttled(FetchError):
    """The server asked us to slow down (503 SlowDown, 429); ``retry_after``: the seconds
    its ``Retry-After`` asked to wait (None: not said), which the retry waits at least."""

    retryable = True
    retry_after: float | None = None


class ServerError(FetchError):
    """The server failed (5xx other than 503 SlowDown)."""

    retryable = True


class ConnectionFailed(FetchError):
    """The connection was refused, reset or closed before the response was complete."""

    retryable = True


class CertificateRefused(FetchError):
    """The server's TLS certificate was refused: an untrusted CA (pass ``ca_bundle=`` for a
    private one), expired, or for another host name."""


class IncompleteBody(FetchError):
    """The body ended before ``Content-Length`` bytes arrived."""

    retryable = True


class IntegrityError(FetchError):
    """The bytes received are not the object's: a checksum mismatch (``ChecksumMismatch``),
    or parts of one read from different versions (``ObjectChanged``). Never delivered."""

    retryable = True


class FetchTimeout(FetchError, TimeoutError):
    """A phase of a GET passed its ``Timeouts`` (``ConnectTimeout``, ``FirstByteTimeout``,
    ``ReadTimeout``, ``AttemptTimeout``), or the object its ``RetryConfig.max_total_seconds``
    (``DeadlineExceeded``, not retried)."""

    retryable = True


class DecodeError(LoaderError):
    """The bytes arrived but could not be decoded into a sample."""


class ShardError(DecodeError):
    """A tar shard is not what its index says (``NotATar``, ``TruncatedShard``,
    ``MissingMember``, ``IndexMismatch``); ``url`` is the shard, the message names the member."""


class SkipBudgetExceeded(LoaderError):
    """``on_error="skip"`` skipped more samples than ``max_skipped`` allows."""


class LoaderStalled(LoaderError, TimeoutError):
    """No batch arrived for ``stall_timeout_s``: the message says what waited on what, with
    every thread's stack."""


class WorkerError(LoaderError):
    """A loader worker process died (killed by the OS, crashed) without raising."""
