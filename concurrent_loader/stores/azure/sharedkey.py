"""A lean Azure Storage Shared Key signer for ``GET`` requests: the ``Authorization``
header the service (and Azurite) checks, exactly as the official SDK's
``SharedKeyCredentialPolicy`` computes it for the same request, with the key decoded once
and ``x-ms-date`` formatted at most once per second; one HMAC-SHA256 per call.

The string to sign (service version 2009-09-19 and later) is the verb, eleven standard
header slots (all empty for a bodiless GET whose range goes in ``x-ms-range``, as the SDK
sends it), the ``x-ms-*`` headers sorted by name, then the canonical resource:
``/account`` + the request path as sent (percent-encoded) + one ``\\nname:value`` line per
query parameter, sorted, values decoded.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import time
from collections.abc import Sequence
from email.utils import formatdate

from ...errors import ConfigError

__all__ = ["API_VERSION", "SharedKeySigner", "string_to_sign"]

#: the service version every request asks for (Bearer tokens need 2017-11-09 or later)
API_VERSION = "2023-11-03"

# Module-level so tests can fix the clock.
_clock = time.time

# The standard header slots after the verb, all empty: Content-Encoding, -Language, -Length,
# -MD5, -Type, Date, If-Modified-Since, If-Match, If-None-Match, If-Unmodified-Since, Range.
_EMPTY_SLOTS = "\n" * 11


def string_to_sign(
    account: str,
    path: str,
    query: Sequence[tuple[str, str]] = (),
    x_ms_headers: Sequence[tuple[str, str]] = (),
) -> str:
    """What Shared Key signs for ``GET path?query`` with these ``x-ms-*`` headers (``path``
    as sent, percent-encoded; ``query`` values not)."""
    headers = "".join(f"{name.lower()}:{value}\n" for name, value in sorted(x_ms_headers))
    resource = "".join(f"\n{name.lower()}:{value}" for name, value in sorted(query))
    return f"GET\n{_EMPTY_SLOTS}{headers}/{account}{path}{resource}"


class SharedKeySigner:
    """Signs GETs for one storage account with its key; holds no other state. Its repr and
    errors never show the key."""

    __slots__ = ("_account", "_date", "_date_second", "_key", "_prefix")

    def __init__(self, account: str, key: str) -> None:
        try:
            self._key = base64.b64decode(key, validate=True)
        except (binascii.Error, ValueError):
            # Not echoed: the message would carry the key into logs.
            raise ConfigError(
                f"the account key of Azure storage account {account!r} is not valid base64"
            ) from None
        self._account = account
        self._prefix = f"SharedKey {account}:"
        self._date_second = -1
        self._date = ""

    def __repr__(self) -> str:
        return f"SharedKeySigner(account={self._account!r}, key=<hidden>)"

    def date(self) -> str:
        """``x-ms-date`` for now (RFC 1123), formatted once per second."""
        now = int(_clock())
        if now != self._date_second:
            self._date_second, self._date = now, formatdate(now, usegmt=True)
        return self._date

    def signature(self, text: str) -> str:
        digest = hmac.new(self._key, text.encode("utf-8"), hashlib.sha256).digest()
        return base64.b64encode(digest).decode("ascii")

    def headers(
        self,
        path: str,
        query: Sequence[tuple[str, str]] = (),
        x_ms_headers: Sequence[tuple[str, str]] = (),
    ) -> list[tuple[str, str]]:
        """``x-ms-date``, ``x-ms-version`` and ``Authorization`` for ``GET path?query`` that
        also sends ``x_ms_headers`` (``x-ms-range``), which are signed, not returned."""
        x_ms = [("x-ms-date", self.date()), ("x-ms-version", API_VERSION)]
        text = string_to_sign(self._account, path, query, [*x_ms, *x_ms_headers])
        return [*x_ms, ("Authorization", self._prefix + self.signature(text))]
