"""A lean AWS Signature Version 4 signer for S3 ``GET`` requests.

:class:`SigV4Signer` produces exactly the ``Authorization`` header botocore's
``S3SigV4Auth`` would for the same request, credentials and second, and guarantees:

* the signing key is derived once per (secret key, UTC day, region, service);
* ``x-amz-date`` is formatted at most once per second;
* a call does one SHA-256 and one HMAC-SHA256, plus string formatting.

Bodiless requests only (the empty payload hash). ``checksum_mode=True`` also sends and signs
``x-amz-checksum-mode: ENABLED``. Paths must be encoded by :func:`encode_s3_path`.
"""

from __future__ import annotations

import hashlib
import hmac
import time
from dataclasses import dataclass, field
from urllib.parse import quote

from concurrent_loader.errors import ConfigError, Reason

__all__ = [
    "CHECKSUM_MODE_HEADER",
    "EMPTY_SHA256",
    "Credentials",
    "SigV4Signer",
    "encode_s3_key",
    "encode_s3_path",
]

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
        # Logs and tracebacks print reprs; the secret and token must never reach them, and
        # the full access key is not needed to tell two credentials apart.
        token = ", token=<set>" if self.token else ""
        return f"Credentials(access_key={self.access_key[:4]!r}..., secret_key=<hidden>{token})"


def encode_s3_key(key: str) -> str:
    """``key`` URI-encoded as S3 and botocore encode it in a path (``/`` kept)."""
    return quote(key, safe="/-_.~")


def encode_s3_path(bucket: str | None, key: str) -> str:
    """Return the URI-encoded request path for ``key``, as S3 and botocore build it.

    ``bucket`` given: path-style ``/bucket/key``; ``None``: virtual-hosted ``/key`` (the
    bucket is in the host name). Every byte of the key except unreserved characters and
    ``/`` is percent-encoded, once; ``/`` runs and ``.``/``..`` segments are kept as they
    are, because S3 keys are opaque strings and S3 does not normalise paths.
    """
    # Equivalent to quoting each "/"-separated segment with safe="-_.~", in one call.
    encoded_key = encode_s3_key(key)
    if bucket is None:
        return "/" + encoded_key
    if not bucket or "/" in bucket:
        raise ConfigError(f"invalid bucket name {bucket!r}", cause=Reason.INVALID_ARGUMENT)
    return f"/{quote(bucket, safe='-_.~')}/{encoded_key}"


class _DayKey:
    """Everything that stays fixed for one set of credentials during one UTC day."""

    __slots__ = (
        "auth_prefix",
        "credentials",
        "datestamp",
        "hmac_template",
        "scope",
        "signed_headers",
        "token",
    )

    def __init__(
        self,
        credentials: Credentials,
        datestamp: str,
        region: str,
        service: str,
        checksum_mode: bool,
    ):
        self.credentials = credentials
        self.token = credentials.token
        self.datestamp = datestamp
        k_date = _hmac(("AWS4" + credentials.secret_key).encode(), datestamp)
        k_signing = _hmac(_hmac(_hmac(k_date, region), service), "aws4_request")
        # Copying a keyed HMAC object skips re-hashing the key pads on every call.
        self.hmac_template = hmac.new(k_signing, digestmod=hashlib.sha256)
        self.scope = f"{datestamp}/{region}/{service}/aws4_request"
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
    """Signs S3 ``GET`` requests with SigV4 headers for one region and service.

    Meant for one event loop, but safe to share across threads: each cache is replaced as
    a whole, so the worst a race can do is compute a key twice.
    """

    __slots__ = (
        "_canonical_host",
        "_day_key",
        "_second_and_date",
        "checksum_mode",
        "region",
        "service",
    )

    def __init__(self, region: str, service: str = "s3", *, checksum_mode: bool = False) -> None:
        if not region or not service:
            raise ConfigError("region and service must be non-empty", cause=Reason.INVALID_ARGUMENT)
        self.region = region
        self.service = service
        self.checksum_mode = checksum_mode
        # What follows ``host:...\n`` among the canonical headers, before x-amz-content-sha256.
        self._canonical_host = "\nx-amz-checksum-mode:ENABLED\n" if checksum_mode else "\n"
        # One tuple, replaced whole, so a reader never pairs one second with another's string.
        self._second_and_date = (-1, "")
        self._day_key: _DayKey | None = None

    def __repr__(self) -> str:
        mode = ", checksum_mode=True" if self.checksum_mode else ""
        return f"SigV4Signer(region={self.region!r}, service={self.service!r}{mode})"

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
        day_key = _DayKey(credentials, datestamp, self.region, self.service, self.checksum_mode)
        self._day_key = day_key
        return day_key

    def headers_for_get(
        self,
        host: str,
        canonical_path: str,
        credentials: Credentials,
        *,
        amz_date: str | None = None,
    ) -> list[tuple[str, str]]:
        """Return the headers that sign ``GET canonical_path`` (no query) for ``host``.

        ``host`` must be exactly the ``Host`` header that will be sent (``name:port`` when
        the port is not the scheme's default). ``canonical_path`` is already URI-encoded
        (:func:`encode_s3_path`). ``amz_date`` (``YYYYMMDDTHHMMSSZ``) overrides the current
        UTC time.
        """
        if amz_date is None:
            amz_date = self._now()
        elif len(amz_date) != 16 or amz_date[8] != "T" or amz_date[15] != "Z":
            raise ConfigError(f"amz_date must look like 20240131T235959Z, got {amz_date!r}")
        day_key = self._key_for(credentials, amz_date[:8])
        # S3 requires x-amz-content-sha256 on every SigV4 request. botocore sends the hash
        # of the empty body for a GET (over http, where it always signs payloads, and over
        # https too since a GET carries no checksum header), so we do the same: the
        # signature then matches botocore's byte for byte and the header is valid for both
        # schemes.
        if day_key.token:
            canonical_request = (
                f"GET\n{canonical_path}\n\nhost:{host}{self._canonical_host}"
                f"x-amz-content-sha256:{EMPTY_SHA256}\nx-amz-date:{amz_date}\n"
                f"x-amz-security-token:{day_key.token}\n\n"
                f"{day_key.signed_headers}\n{EMPTY_SHA256}"
            )
        else:
            canonical_request = (
                f"GET\n{canonical_path}\n\nhost:{host}{self._canonical_host}"
                f"x-amz-content-sha256:{EMPTY_SHA256}\nx-amz-date:{amz_date}\n\n"
                f"{day_key.signed_headers}\n{EMPTY_SHA256}"
            )
        request_hash = hashlib.sha256(canonical_request.encode("utf-8")).hexdigest()
        mac = day_key.hmac_template.copy()
        mac.update(f"{_ALGORITHM}\n{amz_date}\n{day_key.scope}\n{request_hash}".encode())
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
