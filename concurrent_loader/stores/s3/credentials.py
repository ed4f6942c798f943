"""AWS credentials: resolved per process through botocore's standard chain, never printed.

:class:`CredentialSource` is what travels to worker processes: the profile name, the
``anonymous`` flag and, only when the user passed keys explicitly, those keys (which the
workers need to sign). Its ``repr`` hides them. Each process resolves the chain itself
(env vars, shared config/credentials files, SSO, container and instance roles), so nothing
resolved in the parent is reused after a fork. Refreshable credentials are re-read through
botocore at most once a second on the hot path.
"""

from __future__ import annotations

import logging
import os
import re
import time
from dataclasses import dataclass, field
from typing import Any

from ...errors import AccessDenied, Reason
from .sigv4 import Credentials

__all__ = ["CredentialCache", "CredentialSource", "redact_botocore_logs"]

# botocore logs the canonical request and the request headers at DEBUG, session token
# included. The secret key is never logged; the token is, so it is redacted on the way.
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
    """Keep session tokens out of botocore's DEBUG logs (idempotent, costs nothing unless
    those loggers are enabled for DEBUG)."""
    for name in _BOTOCORE_LOGGERS:
        logger = logging.getLogger(name)
        if _redactor not in logger.filters:
            logger.addFilter(_redactor)


@dataclass(frozen=True)
class CredentialSource:
    profile: str | None = None
    anonymous: bool = False
    access_key: str | None = field(default=None, repr=False)
    secret_key: str | None = field(default=None, repr=False)
    session_token: str | None = field(default=None, repr=False)

    def __repr__(self) -> str:
        explicit = ", explicit keys" if self.access_key else ""
        return f"CredentialSource(profile={self.profile!r}, anonymous={self.anonymous}{explicit})"

    def botocore_session(self) -> Any:
        import botocore.session

        session = botocore.session.Session(profile=self.profile)
        if self.access_key and self.secret_key:
            session.set_credentials(self.access_key, self.secret_key, self.session_token)
        return session

    def default_region(self, session: Any = None) -> str | None:
        session = session or self.botocore_session()
        region = session.get_config_variable("region")
        return region if isinstance(region, str) and region else None

    def default_endpoint(self, session: Any = None) -> str | None:
        session = session or self.botocore_session()
        # AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL and the profile's endpoint_url (botocore >= 1.31)
        for name in ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"):
            if os.environ.get(name):
                return os.environ[name]
        try:
            value = session.get_config_variable("endpoint_url")
        except Exception:
            value = None
        return value if isinstance(value, str) and value else None


class CredentialCache:
    """Frozen credentials for signing, refreshed from botocore at most once a second."""

    def __init__(self, source: CredentialSource, url: str, session: Any = None) -> None:
        self._url = url
        self._botocore = (session or source.botocore_session()).get_credentials()
        if self._botocore is None:
            raise AccessDenied(
                "no AWS credentials found (env vars, profile, instance role); pass "
                "anonymous=True to read a public bucket",
                url=url,
                stage="fetch",
                cause=Reason.NO_CREDENTIALS,
            )
        self._frozen = self._read()
        self._checked = time.monotonic()

    def _read(self) -> Credentials:
        frozen = self._botocore.get_frozen_credentials()
        return Credentials(frozen.access_key, frozen.secret_key, frozen.token)

    def get(self) -> Credentials:
        now = time.monotonic()
        if now - self._checked >= 1.0:
            self._frozen = self._read()
            self._checked = now
        return self._frozen

    def __repr__(self) -> str:
        return f"CredentialCache(for {self._url})"
