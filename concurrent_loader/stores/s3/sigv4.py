"""A lean AWS Signature Version 4 signer for S3 ``GET`` requests: exactly the
``Authorization`` header botocore's ``S3SigV4Auth`` gives for the same request, credentials
and second, with the signing key derived once per (secret key, UTC day, region),
``x-amz-date`` formatted at most once per second, and one SHA-256 and one HMAC per call.
Bodiless requests only; ``checksum_mode=True`` also sends and signs
``x-amz-checksum-mode: ENABLED``. Paths must be encoded by :func:`encode_s3_path`.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import time
from dataclasses import dataclass, field
from urllib.parse import quote

from concurrent_loader.errors import ConfigError

__all__ = ["CHECKSUM_MODE_HEADER", "EMPTY_SHA256", "Credentials", "SigV4Signer", "encode_s3_path"]

#: SHA-256 of the empty body, hex-encoded.
EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()

_ALGORITHM = "AWS4-HMAC-SHA256"

#: asks S3 to send the object's checksum headers with a GET
CHECKSUM_MODE_HEADER = ("x-amz-checksum-mode", "ENABLED")

# Module-level so tests can move the clock across a UTC midnight.
_clock = time.time


@dataclass(frozen=True)
class Credentials:
    """AWS credentials. ``repr`` shows only the first 4 characters of the access key."""

    access_key: str
    secret_key: str = field(repr=False)
    token: str | None = field(default=None, repr=False)

    def __repr__(self) -> str:
        token = ", token=<set>" if self.token else ""
        return f"Credentials(access_key={self.access_key[:4]!r}..., secret_key=<hidden>{token})"


# Characters ``quote`` leaves as they are: a key made only of them is its own encoding.
_UNENCODED = re.compile(r"[A-Za-z0-9/\-_.~]*")


def encode_s3_key(key: str) -> str:
    """``key`` URI-encoded as S3 and botocore encode it in a path (``/`` kept)."""
    if _UNENCODED.fullmatch(key):
        return key  # most keys: a quarter of quote's cost
    return quote(key, safe="/-_.~")


def encode_s3_path(bucket: str | None, key: str) -> str:
    """The URI-encoded request path for ``key`` as botocore builds it: path-style
    ``/bucket/key``, or ``/key`` when ``bucket`` is None (virtual-hosted). ``/`` runs and
    ``.``/``..`` segments are kept: S3 does not normalise paths."""
    encoded_key = encode_s3_key(key)
    if bucket is None:
        return "/" + encoded_key
    if not bucket or "/" in bucket:
        raise ConfigError(f"invalid bucket name {bucket!r}")
    return f"/{quote(bucket, safe='-_.~')}/{encoded_key}"


class _DayKey:
    """Everything that stays fixed for one set of credentials during one UTC day."""

    __slots__ = (
        "auth_prefix",
        "credentials",
        "datestamp",
        "inner",
        "outer",
        "scope",
        "signed_headers",
        "token",
        "token_line",
    )

    def __init__(
        self,
        credentials: Credentials,
        datestamp: str,
        region: str,
        checksum_mode: bool,
    ):
        self.credentials = credentials
        self.token = credentials.token
        self.token_line = f"x-amz-security-token:{self.token}\n" if self.token else ""
        self.datestamp = datestamp
        k_date = _hmac(("AWS4" + credentials.secret_key).encode(), datestamp)
        k_signing = _hmac(_hmac(_hmac(k_date, region), "s3"), "aws4_request")
        # HMAC-SHA256 (RFC 2104) as two SHA-256 states after the key pads, copied per call:
        # half the cost of copying a keyed ``hmac`` object.
        padded = k_signing.ljust(64, b"\0")
        self.inner = hashlib.sha256(bytes(b ^ 0x36 for b in padded))
        self.outer = hashlib.sha256(bytes(b ^ 0x5C for b in padded))
        self.scope = f"{datestamp}/{region}/s3/aws4_request"
        signed = "host;x-amz-checksum-mode;" if checksum_mode else "host;"
        signed += "x-amz-content-sha256;x-amz-date"
        self.signed_headers = signed + ";x-amz-security-token" if credentials.token else signed
        self.auth_prefix = (
            f"{_ALGORITHM} Credential={credentials.access_key}/{self.scope}, "
            f"SignedHeaders={self.signed_headers}, Signature="
        )


def _hmac(key: bytes, msg: str) -> bytes:
    return hmac.new(key, msg.encode("utf-8"), hashlib.sha256).digest()


class SigV4Signer:
    """Signs S3 ``GET`` requests for one region; thread-safe (each cache is replaced whole)."""

    __slots__ = (
        "_canonical_host",
        "_day_key",
        "_second_and_date",
        "checksum_mode",
        "region",
    )

    def __init__(self, region: str, *, checksum_mode: bool = False) -> None:
        if not region:
            raise ConfigError("region must be non-empty")
        self.region = region
        self.checksum_mode = checksum_mode
        # What follows ``host:...\n`` among the canonical headers, before x-amz-content-sha256.
        self._canonical_host = "\nx-amz-checksum-mode:ENABLED\n" if checksum_mode else "\n"
        # One tuple, replaced whole, so a reader never pairs one second with another's string.
        self._second_and_date = (-1, "")
        self._day_key: _DayKey | None = None

    def __repr__(self) -> str:
        mode = ", checksum_mode=True" if self.checksum_mode else ""
        return f"SigV4Signer(region={self.region!r}{mode})"

    def _now(self) -> str:
        second = int(_clock())
        cached_second, amz_date = self._second_and_date
        if second != cached_second:
            amz_date = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(second))
            self._second_and_date = (second, amz_date)
        return amz_date

    def _key_for(self, credentials: Credentials, datestamp: str) -> _DayKey:
        day_key = self._day_key
        if (
            day_key is not None
            and day_key.datestamp == datestamp
            and (day_key.credentials is credentials or day_key.credentials == credentials)
        ):
            return day_key
        day_key = _DayKey(credentials, datestamp, self.region, self.checksum_mode)
        self._day_key = day_key
        return day_key

    def headers_for_get(
        self,
        host: str,
        canonical_path: str,
        credentials: Credentials,
        *,
        amz_date: str | None = None,
        query: str = "",
    ) -> list[tuple[str, str]]:
        """The headers that sign ``GET canonical_path`` (encoded) for ``host``, exactly the
        ``Host`` header sent, with ``query`` (canonical: encoded, sorted; none by default).
        ``amz_date`` (``YYYYMMDDTHHMMSSZ``) overrides the time."""
        if amz_date is None:
            amz_date = self._now()
        elif len(amz_date) != 16 or amz_date[8] != "T" or amz_date[15] != "Z":
            raise ConfigError(f"amz_date must look like 20240131T235959Z, got {amz_date!r}")
        day_key = self._key_for(credentials, amz_date[:8])
        # x-amz-content-sha256 is the empty body's hash, as botocore sends it for a GET.
        canonical_request = (
            f"GET\n{canonical_path}\n{query}\nhost:{host}{self._canonical_host}"
            f"x-amz-content-sha256:{EMPTY_SHA256}\nx-amz-date:{amz_date}\n"
            f"{day_key.token_line}\n{day_key.signed_headers}\n{EMPTY_SHA256}"
        )
        request_hash = hashlib.sha256(canonical_request.encode("utf-8")).hexdigest()
        inner = day_key.inner.copy()
        inner.update(f"{_ALGORITHM}\n{amz_date}\n{day_key.scope}\n{request_hash}".encode())
        mac = day_key.outer.copy()
        mac.update(inner.digest())
        headers = [
            ("x-amz-date", amz_date),
            ("x-amz-content-sha256", EMPTY_SHA256),
            ("Authorization", day_key.auth_prefix + mac.hexdigest()),
        ]
        if day_key.token:
            headers.insert(2, ("x-amz-security-token", day_key.token))
        if self.checksum_mode:
            headers.append(CHECKSUM_MODE_HEADER)
        return headers
