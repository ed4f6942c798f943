"""Reading objects from S3 and S3-compatible stores.

The hot path (one GET per object) signs with the lean :class:`~.sigv4.SigV4Signer` and sends
through a pooled :class:`~concurrent_loader.transport.Transport`; botocore is used only to resolve
credentials and region, and aiobotocore only for the control plane (listing), where its
per-request cost does not matter.

Addressing: with an ``endpoint_url`` (MinIO, SeaweedFS, Ceph, R2, ...) requests are
path-style ``{endpoint}/{bucket}/{key}``; without one, virtual-hosted
``https://{bucket}.s3.{region}.amazonaws.com/{key}``.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass

from ..config import FetchConfig
from ..errors import FetchError
from ..transport import Origin, Transport, make_transport
from .base import Reader
from .credentials import CredentialCache, CredentialSource, redact_botocore_logs
from .sigv4 import EMPTY_SHA256, SigV4Signer, encode_s3_path
from .translate import error_for_exception, error_for_status

__all__ = ["ListedObject", "S3Reader", "list_objects", "ssl_context_for"]


@dataclass(frozen=True)
class ListedObject:
    key: str
    size: int


def ssl_context_for(config: FetchConfig) -> ssl.SSLContext:
    context = ssl.create_default_context()
    if not config.verify_tls:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    return context


@dataclass(frozen=True)
class _Endpoint:
    origin: Origin
    path_style: bool


def _endpoint(bucket: str, endpoint_url: str | None, region: str) -> _Endpoint:
    if endpoint_url:
        return _Endpoint(Origin.from_url(endpoint_url), True)
    if "." in bucket:  # a dotted bucket breaks the TLS wildcard certificate
        return _Endpoint(Origin("https", f"s3.{region}.amazonaws.com", 443), True)
    return _Endpoint(Origin("https", f"{bucket}.s3.{region}.amazonaws.com", 443), False)


class S3Reader(Reader):
    """GETs whole objects of one bucket. Create and use it inside one event loop."""

    def __init__(
        self,
        bucket: str,
        *,
        prefix: str = "",
        endpoint_url: str | None = None,
        region: str | None = None,
        anonymous: bool = False,
        credentials: CredentialSource | None = None,
        config: FetchConfig | None = None,
        transport: str = "http1",
    ) -> None:
        config = config or FetchConfig()
        super().__init__(config)
        source = credentials or CredentialSource(anonymous=anonymous)
        if anonymous and not source.anonymous:
            source = CredentialSource(profile=source.profile, anonymous=True)
        self.bucket = bucket
        self.prefix = prefix
        # One botocore session resolves region, endpoint and credentials: each costs file reads.
        session = source.botocore_session()
        self.region = region or source.default_region(session) or "us-east-1"
        self.endpoint_url = endpoint_url or source.default_endpoint(session)
        self._endpoint = _endpoint(bucket, self.endpoint_url, self.region)
        self._path_bucket = bucket if self._endpoint.path_style else None
        self._signer = SigV4Signer(self.region)
        self._credentials = (
            None if source.anonymous else CredentialCache(source, self.url_for(""), session)
        )
        self._transport: Transport = make_transport(
            transport,
            max_connections=config.max_inflight_requests,
            timeouts=config.timeouts,
            ssl_context=ssl_context_for(config),
        )

    def __repr__(self) -> str:
        return f"S3Reader(s3://{self.bucket}/{self.prefix}, endpoint={self.endpoint_url!r})"

    def url_for(self, key: str) -> str:
        return f"s3://{self.bucket}/{self.prefix}{key}"

    async def _get_once(self, key: str, url: str) -> tuple[bytes | bytearray, float | None]:
        origin = self._endpoint.origin
        path = encode_s3_path(self._path_bucket, self.prefix + key)
        if self._credentials is None:
            headers = [("x-amz-content-sha256", EMPTY_SHA256)]
        else:
            # The transport sends origin.host_header as Host: the value signed here.
            headers = self._signer.headers_for_get(
                origin.host_header, path, self._credentials.get()
            )
        response = await self._transport.get(
            origin, path, headers, url=url, max_bytes=self.config.max_object_bytes
        )
        # Both transports already refuse a body shorter than its Content-Length.
        if response.status != 200:
            raise error_for_status(response.status, response.body, url)
        return response.body, response.first_byte_s

    async def close(self) -> None:
        await self._transport.close()


async def list_objects(
    bucket: str,
    prefix: str,
    *,
    endpoint_url: str | None = None,
    region: str | None = None,
    credentials: CredentialSource | None = None,
    config: FetchConfig | None = None,
    page_callback: object = None,
) -> AsyncIterator[ListedObject]:
    """Every object under ``prefix`` (keys relative to it), page by page, via aiobotocore."""
    from aiobotocore.config import AioConfig
    from aiobotocore.session import AioSession
    from botocore import UNSIGNED

    source = credentials or CredentialSource()
    config = config or FetchConfig()
    redact_botocore_logs()
    endpoint_url = endpoint_url or source.default_endpoint()
    session = AioSession(profile=source.profile)
    if source.access_key and source.secret_key:
        session.set_credentials(source.access_key, source.secret_key, source.session_token)
    aio_config = AioConfig(
        signature_version=UNSIGNED if source.anonymous else None,
        s3={"addressing_style": "path"} if endpoint_url else None,
        connect_timeout=config.timeouts.connect,
        read_timeout=config.timeouts.read,
        retries={"max_attempts": config.retry.max_attempts, "mode": "standard"},
    )
    url = f"s3://{bucket}/{prefix}"
    try:
        async with session.create_client(
            "s3",
            endpoint_url=endpoint_url,
            region_name=region or source.default_region() or "us-east-1",
            config=aio_config,
            verify=config.verify_tls,
        ) as client:
            paginator = client.get_paginator("list_objects_v2")
            async for page in paginator.paginate(Bucket=bucket, Prefix=prefix):
                for item in page.get("Contents", ()):
                    yield ListedObject(item["Key"][len(prefix) :], int(item["Size"]))
    except FetchError:
        raise
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        raise error_for_exception(exc, url, stage="list") from exc
