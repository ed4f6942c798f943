"""AWS credentials: resolved once in the main process through botocore's chain, never printed.

:class:`CredentialSource` travels to workers with a :class:`CredentialSnapshot` of what the
chain gave the main process (hidden from ``repr``). A worker signs with it and builds no
botocore session until it nears expiry; then its own chain refreshes, re-read at most once
a second. Only a worker's start (or a fork) carries the snapshot; any other pickle leaves it
out.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import re
import time
from dataclasses import dataclass, field
from typing import Any

from .errors import no_credentials
from .sigv4 import Credentials

__all__ = ["CredentialCache", "CredentialSnapshot", "CredentialSource", "redact_botocore_logs"]

#: seconds before expiry when a snapshot is no longer used (botocore's advisory window)
REFRESH_BEFORE_EXPIRY_S = 15 * 60

# botocore logs request headers at DEBUG, session token included: it is redacted.
_TOKEN = re.compile(r"(?i)(x-amz-security-token['\"]?\s*[:=]\s*b?['\"]?)([^'\"\s,}]+)")
_BOTOCORE_LOGGERS = ("botocore.auth", "botocore.endpoint", "aiobotocore.endpoint")


class _RedactSessionTokens(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        redacted = _TOKEN.sub(r"\1<redacted>", message)
        if redacted != message:
            record.msg, record.args = redacted, ()
        return True


_redactor = _RedactSessionTokens()


def redact_botocore_logs() -> None:
    """Keep session tokens out of botocore's DEBUG logs (idempotent)."""
    for name in _BOTOCORE_LOGGERS:
        logger = logging.getLogger(name)
        if _redactor not in logger.filters:
            logger.addFilter(_redactor)


@dataclass(frozen=True)
class CredentialSnapshot:
    """Credentials botocore's chain gave the main process, for workers to sign with."""

    access_key: str = field(repr=False)
    secret_key: str = field(repr=False)
    token: str | None = field(repr=False)
    #: when they expire (seconds since the epoch); None for keys that do not
    expires_at: float | None = None

    @property
    def usable_until(self) -> float:
        """Until when (seconds since the epoch) to sign with them rather than refresh."""
        if self.expires_at is None:
            return math.inf
        return self.expires_at - REFRESH_BEFORE_EXPIRY_S

    def __reduce__(self) -> tuple[Any, ...]:
        from multiprocessing.context import get_spawning_popen

        if get_spawning_popen() is None:
            return (_left_out, ())
        return (CredentialSnapshot, (self.access_key, self.secret_key, self.token, self.expires_at))


def _left_out() -> None:
    return None


@dataclass(frozen=True)
class CredentialSource:
    profile: str | None = None
    anonymous: bool = False
    access_key: str | None = field(default=None, repr=False)
    secret_key: str | None = field(default=None, repr=False)
    session_token: str | None = field(default=None, repr=False)
    #: what the main process resolved (:meth:`resolved`); not part of the identity
    snapshot: CredentialSnapshot | None = field(default=None, repr=False, compare=False)

    def __repr__(self) -> str:
        explicit = ", explicit keys" if self.access_key else ""
        resolved = ", resolved" if self.snapshot is not None else ""
        return (
            f"CredentialSource(profile={self.profile!r}, anonymous={self.anonymous}"
            f"{explicit}{resolved})"
        )

    @property
    def explicit(self) -> bool:
        return bool(self.access_key and self.secret_key)

    @property
    def needs_resolving(self) -> bool:
        return not (self.anonymous or self.explicit or self.snapshot is not None)

    def resolved(self, session: Any = None) -> CredentialSource:
        """This source with a snapshot of what botocore's chain gives now; unchanged when
        there is nothing to resolve, nothing found, or no expiry known."""
        if not self.needs_resolving:
            return self
        from botocore.credentials import RefreshableCredentials

        found = (session or self.botocore_session()).get_credentials()
        if found is None:
            return self
        frozen = found.get_frozen_credentials()
        expires_at: float | None = None
        if isinstance(found, RefreshableCredentials):
            # botocore keeps the expiry private; without it a snapshot's age is unknown
            expiry = getattr(found, "_expiry_time", None)
            if expiry is None:
                return self
            expires_at = expiry.timestamp()
        snapshot = CredentialSnapshot(
            frozen.access_key, frozen.secret_key, frozen.token, expires_at
        )
        return dataclasses.replace(self, snapshot=snapshot)

    def refresh_snapshot(self) -> None:
        """Resolve the snapshot again, in place, once it is past :attr:`~CredentialSnapshot.
        usable_until` (in the main process, before it starts workers that would otherwise
        each refresh their own). A snapshot still usable costs one clock read."""
        snapshot = self.snapshot
        if snapshot is None or time.time() < snapshot.usable_until:
            return
        try:
            fresh = dataclasses.replace(self, snapshot=None).resolved()
        except Exception:  # each worker's own chain tries then, and reports what fails
            logging.getLogger(__name__).debug("refreshing credentials failed", exc_info=True)
            return
        # Not part of the identity (compare=False): the source stays equal and hashable.
        object.__setattr__(self, "snapshot", fresh.snapshot)

    def botocore_session(self) -> Any:
        import botocore.session

        session = botocore.session.Session(profile=self.profile)
        if self.access_key and self.secret_key:
            session.set_credentials(self.access_key, self.secret_key, self.session_token)
        return session


class CredentialCache:
    """Credentials for signing: explicit keys, else the main process's snapshot while it is
    usable, else this process's own botocore chain, made on first need and re-read at most
    once a second (botocore refreshes what expires)."""

    def __init__(self, source: CredentialSource, url: str, session: Any = None) -> None:
        self._source = source
        self._url = url
        self._session = session
        self._botocore: Any = None
        self._checked = 0.0
        snapshot = source.snapshot
        if source.access_key and source.secret_key:
            self._frozen = Credentials(source.access_key, source.secret_key, source.session_token)
            self._until = math.inf
        elif snapshot is not None:
            self._frozen = Credentials(snapshot.access_key, snapshot.secret_key, snapshot.token)
            self._until = snapshot.usable_until
        else:
            self._until = -math.inf
            self._frozen = self._refresh()

    def _refresh(self) -> Credentials:
        if self._botocore is None:
            session = self._session or self._source.botocore_session()
            self._session = None  # used once: the chain below is what this cache keeps
            self._botocore = session.get_credentials()
            if self._botocore is None:
                raise no_credentials(self._url)
        frozen = self._botocore.get_frozen_credentials()
        self._checked = time.monotonic()
        return Credentials(frozen.access_key, frozen.secret_key, frozen.token)

    def get(self) -> Credentials:
        if time.time() < self._until:
            return self._frozen
        if self._botocore is None or time.monotonic() - self._checked >= 1.0:
            self._frozen = self._refresh()
        return self._frozen

    def __repr__(self) -> str:
        return f"CredentialCache(for {self._url})"
