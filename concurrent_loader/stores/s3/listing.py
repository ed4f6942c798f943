"""Listing an S3 prefix through aiobotocore (the control plane), for :class:`~.store.S3Store`.

One :class:`S3Lister` per store holds one aiobotocore client, made on first use on the
store's loop and shared by the listings in flight (its connection pool is sized for
``FetchConfig.inflight_cap`` of them), closed with the store. A listing yields the pages of
``ListObjectsV2`` for a prefix, with or without ``Delimiter="/"``; a failure is the
error tree's class naming the prefix listed (``s3://bucket/prefix/``), stage ``list``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from ...config import FetchConfig
from ...errors import FetchError
from ..base import Level, ObjectInfo
from .credentials import CredentialSource, redact_botocore_logs
from .errors import error_for_exception, refused_certificate
from .route import S3Route

__all__ = ["Bucket", "S3Lister"]


@dataclass(frozen=True)
class Bucket:
    """What listing needs of an ``S3Config``: where the root is and how to reach it."""

    bucket: str
    prefix: str
    endpoint_url: str | None
    addressing_style: str | None
    credentials: CredentialSource

    def url_for(self, key: str) -> str:
        return f"s3://{self.bucket}/{self.prefix}{key}"


class S3Lister:
    """Lists prefixes of ``config``'s bucket on ``route``; use and close it on one loop."""

    def __init__(self, config: Bucket, route: S3Route, fetch: FetchConfig) -> None:
        self._config = config
        self._route = route
        self._fetch = fetch
        self._client: asyncio.Future[tuple[Any, Any]] | None = None

    async def level(self, prefix: str, *, delimited: bool, first_page: int | None = None) -> Level:
        """What ``prefix`` (relative to the root) holds: see ``DelimitedStore.list_level``."""
        objects: list[ObjectInfo] = []
        prefixes: list[str] = []
        root = self._config.prefix
        truncated = False
        async for page in self.pages(prefix, delimited=delimited, first_page=first_page):
            for item in page.get("Contents", ()):
                objects.append(ObjectInfo(item["Key"][len(root) :], int(item["Size"])))
            for common in page.get("CommonPrefixes", ()):
                prefixes.append(common["Prefix"][len(root) :])
            truncated = bool(page.get("IsTruncated"))
        return Level(objects, prefixes, truncated)

    async def pages(
        self, prefix: str, *, delimited: bool, first_page: int | None = None
    ) -> AsyncIterator[dict[str, Any]]:
        """The ``ListObjectsV2`` pages of ``prefix`` (relative to the root); with
        ``first_page``, the first page only, of at most that many entries."""
        url = self._config.url_for(prefix)
        arguments: dict[str, Any] = {
            "Bucket": self._config.bucket,
            "Prefix": self._config.prefix + prefix,
        }
        if delimited:
            arguments["Delimiter"] = "/"
        try:
            client = await self._opened()
            if first_page is not None:
                yield await client.list_objects_v2(**arguments, MaxKeys=first_page)
                return
            async for page in client.get_paginator("list_objects_v2").paginate(**arguments):
                yield page
        except (FetchError, asyncio.CancelledError):
            raise
        except Exception as exc:
            raise error_for_exception(exc, url, stage="list") from exc

    async def _opened(self) -> Any:
        if self._client is None:
            self._client = asyncio.ensure_future(self._open())
        # Shielded: a cancelled listing must not cancel the client others wait for.
        client, _ = await asyncio.shield(self._client)
        return client

    async def _open(self) -> tuple[Any, Any]:
        from aiobotocore.config import AioConfig
        from aiobotocore.session import AioSession
        from botocore import UNSIGNED

        config, source, fetch = self._config, self._config.credentials, self._fetch
        redact_botocore_logs()
        session = AioSession(profile=source.profile)
        if source.access_key and source.secret_key:
            session.set_credentials(source.access_key, source.secret_key, source.session_token)
        aio_config = AioConfig(
            signature_version=UNSIGNED if source.anonymous else None,
            s3={"addressing_style": config.addressing_style} if config.addressing_style else None,
            connect_timeout=fetch.timeouts.connect,
            read_timeout=fetch.timeouts.read,
            # total_max_attempts counts the first attempt, as RetryConfig.max_attempts does.
            retries={"total_max_attempts": fetch.retry.max_attempts, "mode": "standard"},
            max_pool_connections=fetch.inflight_cap,
        )
        creator = session.create_client(
            "s3",
            endpoint_url=config.endpoint_url,
            region_name=self._route.region,
            config=aio_config,
            verify=(self._route.ca_bundle or None) if fetch.verify_tls else False,
        )
        client = await creator.__aenter__()
        client.meta.events.register_first("needs-retry.s3", _no_retry_of_certificates)
        return client, creator

    async def close(self) -> None:
        opening, self._client = self._client, None
        if opening is None:
            return
        if not opening.done():
            opening.cancel()
        try:
            _, creator = await opening
        except BaseException:
            return
        await creator.__aexit__(None, None, None)


def _no_retry_of_certificates(caught_exception: BaseException | None = None, **_: Any) -> None:
    """A botocore ``needs-retry`` handler: a refused certificate ends the listing at once."""
    from botocore.exceptions import SSLError

    if isinstance(caught_exception, SSLError) and refused_certificate(caught_exception):
        raise caught_exception
