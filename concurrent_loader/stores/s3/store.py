"""The S3 backend: :class:`S3Config` (where and how to reach a bucket) and :class:`S3Store`.

The hot path (one GET per object or range) signs with the lean
:class:`~concurrent_loader.stores.s3.sigv4.SigV4Signer` and sends through a pooled
:class:`~concurrent_loader.transport.Transport`; botocore only resolves credentials and
region, and aiobotocore serves the control plane (listing), where its per-request cost does
not matter.

Addressing: with an ``endpoint_url`` (MinIO, SeaweedFS, Ceph, R2, ...) requests are
path-style ``{endpoint}/{bucket}/{key}``; without one, virtual-hosted
``https://{bucket}.s3.{region}.amazonaws.com/{key}`` (path-style for dotted buckets, whose
names break the wildcard certificate).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from ...config import FetchConfig
from ...errors import ConfigError, FetchError, Reason
from ...transport import Origin, Transport, make_transport
from ..base import Body, ByteRange, Capabilities, ObjectInfo
from ..tls import ssl_context_for
from .credentials import CredentialCache, CredentialSource, redact_botocore_logs
from .errors import error_for_exception, error_for_response
from .sigv4 import EMPTY_SHA256, SigV4Signer, encode_s3_path

__all__ = ["S3Config", "S3Store"]

_CAPABILITIES = Capabilities(remote=True, listing=True, ranges=True)


@dataclass(frozen=True)
class S3Config:
    """``s3://bucket/prefix`` and how to reach it. Holds no resolved credential or client."""

    bucket: str
    prefix: str = ""
    endpoint_url: str | None = None
    region: str | None = None
    credentials: CredentialSource = field(default_factory=CredentialSource)
    transport: str = "http1"

    @property
    def capabilities(self) -> Capabilities:
        return _CAPABILITIES

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        endpoint_url: str | None = None,
        region: str | None = None,
        anonymous: bool = False,
        profile: str | None = None,
        aws_access_key_id: str | None = None,
        aws_secret_access_key: str | None = None,
        aws_session_token: str | None = None,
        transport: str = "http1",
    ) -> S3Config:
        parts = urlsplit(url)
        bucket = parts.netloc
        if not bucket or "@" in bucket or ":" in bucket:
            raise ConfigError(
                f"malformed S3 URL {url!r}: expected s3://bucket/prefix",
                cause=Reason.INVALID_ARGUMENT,
            )
        prefix = parts.path.lstrip("/")
        if prefix and not prefix.endswith("/"):
            prefix += "/"
        if endpoint_url is not None:
            endpoint = urlsplit(endpoint_url)
            if endpoint.scheme not in ("http", "https") or not endpoint.hostname:
                raise ConfigError(
                    f"malformed endpoint_url {endpoint_url!r}: expected http(s)://host[:port]",
                    url=f"s3://{bucket}/{prefix}",
                    cause=Reason.INVALID_ARGUMENT,
                )
        credentials = CredentialSource(
            profile=profile,
            anonymous=anonymous,
            access_key=aws_access_key_id,
            secret_key=aws_secret_access_key,
            session_token=aws_session_token,
        )
        return cls(bucket, prefix, endpoint_url, region, credentials, transport)

    def url_for(self, key: str) -> str:
        return f"s3://{self.bucket}/{self.prefix}{key}"

    def open(self, fetch: FetchConfig) -> S3Store:
        return S3Store(self, fetch)

    def __str__(self) -> str:
        return self.url_for("")


class S3Store:
    """GETs objects (or byte ranges) of one bucket. Open and use it inside one event loop."""

    capabilities = _CAPABILITIES

    def __init__(self, config: S3Config, fetch: FetchConfig) -> None:
        self.config = config
        self._fetch = fetch
        source = config.credentials
        # One botocore session resolves region, endpoint and credentials: each costs file reads.
        session = source.botocore_session()
        self.region = config.region or source.default_region(session) or "us-east-1"
        self.endpoint_url = config.endpoint_url or source.default_endpoint(session)
        self._origin, path_style = _addressing(config.bucket, self.endpoint_url, self.region)
        self._path_bucket = config.bucket if path_style else None
        self._signer = SigV4Signer(self.region)
        self._credentials = (
            None if source.anonymous else CredentialCache(source, self.url_for(""), session)
        )
        self._transport: Transport = make_transport(
            config.transport,
            max_connections=fetch.max_connections,
            timeouts=fetch.timeouts,
            ssl_context=ssl_context_for(fetch),
        )

    def __repr__(self) -> str:
        return f"S3Store({self.config}, endpoint={self.endpoint_url!r})"

    def url_for(self, key: str) -> str:
        return self.config.url_for(key)

    async def get(self, key: str, byte_range: ByteRange | None = None) -> Body:
        url = self.url_for(key)
        path = encode_s3_path(self._path_bucket, self.config.prefix + key)
        host = self._origin.host_header
        if self._credentials is None:
            headers = [("x-amz-content-sha256", EMPTY_SHA256)]
        else:
            headers = self._signer.headers_for_get(host, path, self._credentials.get())
        response = await self._transport.get(
            self._origin,
            path,
            headers,
            url=url,
            max_bytes=self._fetch.max_object_bytes,
            byte_range=(byte_range.start, byte_range.end) if byte_range else None,
        )
        # The transports refuse a body shorter than its Content-Length (or its range).
        if response.status not in (200, 206):
            raise error_for_response(response.status, response.body, url)
        return Body(response.body, response.first_byte_s)

    async def list(self) -> AsyncIterator[ObjectInfo]:
        """Every object under the prefix (keys relative to it), page by page, via aiobotocore."""
        from aiobotocore.config import AioConfig
        from aiobotocore.session import AioSession
        from botocore import UNSIGNED

        config, source, fetch = self.config, self.config.credentials, self._fetch
        redact_botocore_logs()
        session = AioSession(profile=source.profile)
        if source.access_key and source.secret_key:
            session.set_credentials(source.access_key, source.secret_key, source.session_token)
        aio_config = AioConfig(
            signature_version=UNSIGNED if source.anonymous else None,
            s3={"addressing_style": "path"} if self.endpoint_url else None,
            connect_timeout=fetch.timeouts.connect,
            read_timeout=fetch.timeouts.read,
            retries={"max_attempts": fetch.retry.max_attempts, "mode": "standard"},
        )
        prefix = config.prefix
        try:
            client_args: dict[str, Any] = {
                "endpoint_url": self.endpoint_url,
                "region_name": self.region,
                "config": aio_config,
                "verify": fetch.verify_tls,
            }
            async with session.create_client("s3", **client_args) as client:
                paginator = client.get_paginator("list_objects_v2")
                async for page in paginator.paginate(Bucket=config.bucket, Prefix=prefix):
                    for item in page.get("Contents", ()):
                        yield ObjectInfo(item["Key"][len(prefix) :], int(item["Size"]))
        except (FetchError, asyncio.CancelledError):
            raise
        except Exception as exc:
            raise error_for_exception(exc, self.url_for(""), stage="list") from exc

    async def close(self) -> None:
        await self._transport.close()


def _addressing(bucket: str, endpoint_url: str | None, region: str) -> tuple[Origin, bool]:
    """Where GETs for ``bucket`` go, and whether the bucket is in the path (path style)."""
    if endpoint_url:
        return Origin.from_url(endpoint_url), True
    if "." in bucket:  # a dotted bucket breaks the TLS wildcard certificate
        return Origin("https", f"s3.{region}.amazonaws.com", 443), True
    return Origin("https", f"{bucket}.s3.{region}.amazonaws.com", 443), False
