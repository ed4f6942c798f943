"""The S3 backend: :class:`S3Config` (where and how to reach a bucket) and :class:`S3Store`.

GETs are signed by :class:`~.sigv4.SigV4Signer` and sent through the pooled transport; the
route (:mod:`.route`) and credentials (:mod:`.credentials`) are botocore's, resolved once
when the dataset is made (a worker builds no botocore session unless it must), and
aiobotocore lists from the same configuration (:mod:`.listing`), a whole prefix or one
level of it (``delimiter_listing``: the root is listed by prefixes in parallel). A ``301``
naming another region re-resolves the route once and retries; any other wrong-region
answer is ``BadRequest`` (``WRONG_REGION``). Every GET asks for the object's checksum and
checks the body (``verify_checksums``, on; ``verify_etag_md5``, off; :mod:`..checksum`),
piece by piece as the transport reads it (a fresh digest per response: retries and hedges
share none).
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import random
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from functools import partial
from typing import Any
from urllib.parse import urlsplit

from ...config import FetchConfig
from ...errors import BadRequest, ConfigError, FetchError, Reason
from ...transport import ConnectionPool, DigestFor, Proxy
from ..base import Body, ByteRange, Capabilities, Level, ObjectInfo
from ..checksum import RunningChecksum, covers_whole_object, s3_checksum
from ..shared import ssl_context_for
from .credentials import CredentialCache, CredentialSource
from .errors import error_for_response
from .listing import Bucket, S3Lister, page_query, parse_page
from .route import S3Route, resolve_route
from .sigv4 import CHECKSUM_MODE_HEADER, EMPTY_SHA256, SigV4Signer, encode_s3_key

__all__ = ["S3Config", "S3Store"]

_CAPABILITIES = Capabilities(remote=True, listing=True, ranges=True, delimiter_listing=True)
#: the largest listing page read, in bytes (1,000 keys of up to 1,024 bytes, in XML)
_MAX_PAGE_BYTES = 64 * 1024 * 1024


@dataclass(frozen=True)
class S3Config:
    """``s3://bucket/prefix`` and how to reach it. Holds no resolved credential or client."""

    bucket: str
    prefix: str = ""
    endpoint_url: str | None = None
    region: str | None = None
    credentials: CredentialSource = field(default_factory=CredentialSource)
    #: ``"path"``, ``"virtual"`` or None (botocore's ``auto``)
    addressing_style: str | None = None
    #: a CA bundle to trust, over the profile's ``ca_bundle`` and ``AWS_CA_BUNDLE``
    ca_bundle: str | None = None
    #: where GETs go, resolved by :meth:`resolved` (in the main process) or on first open
    route: S3Route | None = None
    #: ask for the object's checksum with every GET and check bodies against it
    verify_checksums: bool = True
    #: also take a single-part ETag (32 hex digits) as the MD5 of the body: not so for
    #: SSE-KMS and SSE-C objects, hence opt-in
    verify_etag_md5: bool = False

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
        addressing_style: str | None = None,
        ca_bundle: str | None = None,
        verify_checksums: bool = True,
        verify_etag_md5: bool = False,
    ) -> S3Config:
        """The config for ``s3://bucket/prefix`` with these options, given to a dataset as its
        root. Credentials come from botocore's chain unless ``anonymous`` or given; they never
        appear in the ``repr``. A URL that is not ``s3://`` is a ``ConfigError``."""
        parts = urlsplit(url)
        if parts.scheme.lower() != "s3":
            raise ConfigError(f"S3 options apply to an s3://bucket/prefix root, not {url!r}")
        bucket = parts.netloc
        if not bucket or "@" in bucket or ":" in bucket:
            raise ConfigError(f"malformed S3 URL {url!r}: expected s3://bucket/prefix")
        prefix = parts.path.lstrip("/")
        if prefix and not prefix.endswith("/"):
            prefix += "/"
        if endpoint_url is not None:
            endpoint = urlsplit(endpoint_url)
            if endpoint.scheme not in ("http", "https") or not endpoint.hostname:
                raise ConfigError(
                    f"malformed endpoint_url {endpoint_url!r}: expected http(s)://host[:port]",
                    url=f"s3://{bucket}/{prefix}",
                )
        credentials = CredentialSource(
            profile=profile,
            anonymous=anonymous,
            access_key=aws_access_key_id,
            secret_key=aws_secret_access_key,
            session_token=aws_session_token,
        )
        if addressing_style not in (None, "path", "virtual", "auto"):
            raise ConfigError(
                f"addressing_style must be 'path', 'virtual' or 'auto', got {addressing_style!r}"
            )
        if ca_bundle is not None and not os.path.isfile(ca_bundle):
            raise ConfigError(f"ca_bundle {ca_bundle!r} is not a file")
        return cls(
            bucket,
            prefix,
            endpoint_url,
            region,
            credentials,
            addressing_style,
            ca_bundle,
            verify_checksums=verify_checksums,
            verify_etag_md5=verify_etag_md5,
        )

    def url_for(self, key: str) -> str:
        return f"s3://{self.bucket}/{self.prefix}{key}"

    def with_root(self, url: str) -> S3Config:
        """The same options for another ``s3://bucket/prefix`` (a manifest's folder, say)."""
        other = S3Config.from_url(url)
        same_bucket = other.bucket == self.bucket
        return dataclasses.replace(
            self,
            bucket=other.bucket,
            prefix=other.prefix,
            route=self.route if same_bucket else None,
        )

    def resolved(self) -> S3Config:
        """This config with its route and credentials resolved (in the main process)."""
        if self.route is not None and not self.credentials.needs_resolving:
            return self
        session = self.credentials.botocore_session()
        return dataclasses.replace(
            self,
            route=self.route or self.resolve_route(session=session),
            credentials=self.credentials.resolved(session),
        )

    def resolve_route(self, region: str | None = None, session: Any = None) -> S3Route:
        return resolve_route(
            self.bucket,
            session or self.credentials.botocore_session(),
            endpoint_url=self.endpoint_url,
            region=region or self.region,
            addressing_style=self.addressing_style,
            ca_bundle=self.ca_bundle,
            url=self.url_for(""),
        )

    def open(self, fetch: FetchConfig) -> S3Store:
        return S3Store(self, fetch)

    def bucket_to_list(self) -> Bucket:
        return Bucket(
            self.bucket, self.prefix, self.endpoint_url, self.addressing_style, self.credentials
        )

    def __str__(self) -> str:
        return self.url_for("")


class S3Store:
    """GETs objects (or byte ranges) of one bucket. Open and use it inside one event loop."""

    capabilities = _CAPABILITIES

    def __init__(self, config: S3Config, fetch: FetchConfig) -> None:
        self.config = config
        self._fetch = fetch
        source = config.credentials
        session = None
        if config.route is None:
            session = source.botocore_session()
        self._route = config.route or config.resolve_route(session=session)
        self._redirect: asyncio.Future[None] | None = None
        self._signer = self._signer_for(self._route.region)
        # Listing pages ask for no checksum.
        self._list_signer = SigV4Signer(self._route.region)
        self._credentials = (
            None if source.anonymous else CredentialCache(source, self.url_for(""), session)
        )
        self._transport = self._make_transport(self._route)
        self._lister = S3Lister(config.bucket_to_list(), self._route, fetch)
        # The transport's digest_for, for a whole body and for a range.
        self._digest_for: tuple[DigestFor, DigestFor] | None = None
        if config.verify_checksums or config.verify_etag_md5:
            self._digest_for = (partial(self._running, False), partial(self._running, True))

    def _signer_for(self, region: str) -> SigV4Signer:
        return SigV4Signer(region, checksum_mode=self.config.verify_checksums)

    def _make_transport(self, route: S3Route) -> ConnectionPool:
        tls = route.origin.scheme == "https"
        return ConnectionPool(
            max_connections=self._fetch.max_connections,
            timeouts=self._fetch.timeouts,
            ssl_context=ssl_context_for(self._fetch, route.ca_bundle) if tls else None,
            proxy=Proxy.from_url(route.proxy) if route.proxy else None,
        )

    def __repr__(self) -> str:
        return f"S3Store({self.config}, {self._route!r})"

    @property
    def region(self) -> str:
        return self._route.region

    def url_for(self, key: str) -> str:
        return self.config.url_for(key)

    async def get(self, key: str, byte_range: ByteRange | None = None) -> Body:
        url = self.url_for(key)
        route = self._route
        path = route.path_prefix + encode_s3_key(self.config.prefix + key)
        host = route.origin.host_header
        if self._credentials is None:
            headers = [("x-amz-content-sha256", EMPTY_SHA256)]
            if self.config.verify_checksums:
                headers.append(CHECKSUM_MODE_HEADER)
        else:
            headers = self._signer.headers_for_get(host, path, self._credentials.get())
        digest_for = None
        if self._digest_for is not None:
            digest_for = self._digest_for[byte_range is not None]
        response = await self._transport.get(
            route.origin,
            path,
            headers,
            url=url,
            max_bytes=self._fetch.max_object_bytes,
            byte_range=(byte_range.start, byte_range.end) if byte_range else None,
            digest_for=digest_for,
        )
        if response.status in (200, 206):
            etag = response.headers.get("etag")
            body = Body(response.body, response.first_byte_s, etag)
            if isinstance(response.digest, RunningChecksum):
                response.digest.check(url)
            if byte_range is not None and not covers_whole_object(response.headers):
                # A part of the object: the whole object's checksum that a 200 for a range
                # carries (rclone's answer), else the ETag as its MD5, is checked once the
                # parts are assembled.
                config = self.config
                whole_checksum = None
                if config.verify_checksums and response.status == 200:
                    whole_checksum = s3_checksum(response.headers, etag_md5=False)
                if whole_checksum is None and config.verify_etag_md5:
                    whole_checksum = s3_checksum({"etag": etag or ""}, etag_md5=True)
                body.object_checksum = whole_checksum
            return body
        region = response.headers.get("x-amz-bucket-region")
        if region and region != route.region and response.status in (301, 400):
            await self._follow_region(region)
            if self._route.region == region:
                return await self.get(key, byte_range)
        error = error_for_response(response.status, response.body, url)
        if region and region != route.region:
            raise BadRequest(
                f"{error.message}: the bucket is in region {region!r}, not {route.region!r}; "
                f"pass region={region!r}",
                url=url,
                stage="fetch",
                cause=Reason.WRONG_REGION,
                status=response.status,
                code=error.code,
            )
        raise error

    def _running(
        self, ranged: bool, status: int, headers: dict[str, str]
    ) -> RunningChecksum | None:
        """A fresh check of each successful response's body, fed as it arrives (so the bytes
        are checked while still in the CPU's cache), against S3's checksum (on a ``206``,
        that part's, as botocore checks it; a ``200`` for a range is checked only when it is
        the whole object), else, on a whole body, its ETag as MD5."""
        if status not in (200, 206):
            return None
        config = self.config
        whole = not ranged or covers_whole_object(headers)
        # A 200 for a range (rclone's answer) may carry the whole object's checksum.
        part_checksum = whole or status == 206
        checksum = None
        if config.verify_checksums and part_checksum:
            checksum = s3_checksum(headers, etag_md5=False)
        etag_md5 = config.verify_etag_md5 and whole
        if checksum is None and etag_md5:
            checksum = s3_checksum({"etag": headers.get("etag", "")}, etag_md5=True)
        return None if checksum is None else checksum.running()

    async def _follow_region(self, region: str) -> None:
        """Switch to ``region``'s route, once per store (redirected GETs share it)."""
        if self._redirect is None:
            self._redirect = asyncio.ensure_future(self._switch_region(region))
        await asyncio.shield(self._redirect)

    async def _switch_region(self, region: str) -> None:
        loop = asyncio.get_running_loop()
        route = await loop.run_in_executor(None, self.config.resolve_route, region)
        old, self._transport = self._transport, self._make_transport(route)
        lister = S3Lister(self.config.bucket_to_list(), route, self._fetch)
        old_lister, self._lister = self._lister, lister
        self._route = route
        self._signer = self._signer_for(route.region)
        self._list_signer = SigV4Signer(route.region)
        await old.close()
        await old_lister.close()

    async def list(self) -> AsyncIterator[ObjectInfo]:
        """Every object under the prefix, page by page, via aiobotocore."""
        root = self.config.prefix
        async for page in self._lister.pages(""):
            for item in page.get("Contents", ()):
                yield ObjectInfo(item["Key"][len(root) :], int(item["Size"]))

    async def list_level(
        self, prefix: str, *, delimited: bool, first_page: int | None = None
    ) -> Level:
        """The objects under ``prefix`` (and, ``delimited``, its sub-prefixes instead of what
        is below them): ``DelimitedStore``'s contract. Pages are signed GETs through the
        store's transport (:func:`.listing.page_query`, :func:`.listing.parse_page`)."""
        url = self.url_for(prefix)
        objects: list[ObjectInfo] = []
        prefixes: list[str] = []
        token = None
        while True:
            query = page_query(
                self.config.prefix + prefix, delimited=delimited, token=token, max_keys=first_page
            )
            try:
                body = await self._list_page(query, url)
                level, token = parse_page(body, self.config.prefix, url)
            except FetchError as exc:
                exc.__setstate__({"stage": "list"})  # sets it and renders the message again
                raise
            objects += level.objects
            prefixes += level.prefixes
            if token is None or first_page is not None:
                return Level(objects, prefixes, level.truncated)

    async def _list_page(self, query: str, url: str) -> bytes | bytearray:
        """One listing page's body; a retryable failure is tried again, up to
        ``RetryConfig.max_attempts`` attempts in all, after a full-jitter backoff."""
        retry = self._fetch.retry
        attempt = 1
        while True:
            route = self._route
            # The bucket's own path, as botocore sends it: /bucket (path style) or /.
            path = route.path_prefix.rstrip("/") or "/"
            if self._credentials is None:
                headers = [("x-amz-content-sha256", EMPTY_SHA256)]
            else:
                credentials = self._credentials.get()
                headers = self._list_signer.headers_for_get(
                    route.origin.host_header, path, credentials, query=query
                )
            try:
                response = await self._transport.get(
                    route.origin,
                    f"{path}?{query}",
                    headers,
                    url=url,
                    max_bytes=_MAX_PAGE_BYTES,  # a page of 1,000 long keys, whatever the objects
                )
                if response.status == 200:
                    return response.body
                region = response.headers.get("x-amz-bucket-region")
                if region and region != route.region and response.status in (301, 400):
                    await self._follow_region(region)  # as a GET does; then again
                    if self._route.region == region:
                        continue
                raise error_for_response(response.status, response.body, url)
            except FetchError as exc:
                if not exc.retryable or attempt >= retry.max_attempts:
                    raise
            cap = min(retry.max_delay, retry.base_delay * 2 ** (attempt - 1))
            await asyncio.sleep(random.uniform(0, cap))
            attempt += 1

    async def close(self) -> None:
        await self._lister.close()
        await self._transport.close()
