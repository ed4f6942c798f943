"""The Google Cloud Storage backend: :class:`GcsConfig` (``gs://bucket/prefix`` and how to
reach it) and :class:`GcsStore`, over the JSON API.

A GET is ``GET /storage/v1/b/{bucket}/o/{object}?alt=media`` (the object name
percent-encoded whole, ``/`` included), a byte range a ``Range`` header, sent through the
pooled transport with the token of :mod:`.credentials` (none when anonymous). A listing is
``GET /storage/v1/b/{bucket}/o?prefix=...`` page by page (``pageToken``), only names and
sizes asked for (``fields``), through the same pool. Requests go only to the configured
endpoint (``https://storage.googleapis.com`` unless ``endpoint_url`` or
``STORAGE_EMULATOR_HOST`` says otherwise). Bodies are checked against ``x-goog-hash``
(crc32c, else md5) as they arrive: a whole one at once, a part's (the whole object's
checksum) once the parts are assembled (:mod:`..checksum`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import pickle
import random
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from functools import partial
from typing import Any
from urllib.parse import quote, urlencode, urlsplit

from ...config import FetchConfig
from ...errors import ConfigError, FetchError, Reason, Throttled
from ...transport import ConnectionPool, Origin, Proxy, Response
from ..base import Body, ByteRange, Capabilities, ObjectInfo
from ..checksum import RunningChecksum, covers_whole_object, http_checksum
from ..http import _environ_proxy
from ..shared import ssl_context_for
from .credentials import Headers, TokenSource
from .errors import error_for_response

__all__ = ["DEFAULT_ENDPOINT", "GcsConfig", "GcsRoute", "GcsStore"]

DEFAULT_ENDPOINT = "https://storage.googleapis.com"
#: names per listing page (the JSON API's maximum)
PAGE_SIZE = 1000
#: the largest listing page read, in bytes
_MAX_PAGE_BYTES = 64 * 1024 * 1024

_CAPABILITIES = Capabilities(remote=True, listing=True, ranges=True)


@dataclass(frozen=True)
class GcsRoute:
    """Where a config's requests go: the endpoint's origin and path (no credential); it
    also keeps the node cache's entries of two endpoints apart."""

    origin: Origin
    path_prefix: str


@dataclass(frozen=True)
class GcsConfig:
    """``gs://bucket/prefix`` and how to reach it: frozen, hashable, picklable. Holds no
    credential: each process that opens a store loads its own (:mod:`.credentials`)."""

    bucket: str
    prefix: str = ""
    #: where requests go (``scheme://host[:port][/path]``); None: Google's endpoint
    endpoint_url: str | None = None
    #: send no token (public buckets, emulators)
    anonymous: bool = False
    #: a service account key (or other credentials) file, instead of the ADC chain
    credentials_file: str | None = None
    #: a module-level function returning google-auth credentials, called in each process
    #: that opens a store (must pickle by reference), instead of the ADC chain
    credentials: Callable[[], Any] | None = None
    #: a CA bundle to trust instead of the system's
    ca_bundle: str | None = None
    #: check bodies against ``x-goog-hash``
    verify_checksums: bool = True

    @property
    def capabilities(self) -> Capabilities:
        return _CAPABILITIES

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        endpoint_url: str | None = None,
        anonymous: bool = False,
        credentials_file: str | None = None,
        credentials: Callable[[], Any] | None = None,
        ca_bundle: str | None = None,
        verify_checksums: bool = True,
    ) -> GcsConfig:
        """The config for ``gs://bucket/prefix``, given to a dataset as its root. Without
        ``endpoint_url``, ``STORAGE_EMULATOR_HOST`` (read now) is the endpoint, anonymous,
        as Google's libraries take it. Credentials: ``credentials()``, else
        ``credentials_file``, else Application Default Credentials, unless ``anonymous``."""
        parts = urlsplit(url)
        if parts.scheme.lower() != "gs":
            raise ConfigError(f"GCS options apply to a gs://bucket/prefix root, not {url!r}")
        bucket = parts.netloc
        if not bucket or "@" in bucket or ":" in bucket or parts.query or parts.fragment:
            raise ConfigError(f"malformed GCS URL {url!r}: expected gs://bucket/prefix")
        prefix = parts.path.lstrip("/")
        if prefix and not prefix.endswith("/"):
            prefix += "/"
        root = f"gs://{bucket}/{prefix}"
        if endpoint_url is None and os.environ.get("STORAGE_EMULATOR_HOST"):
            endpoint_url = os.environ["STORAGE_EMULATOR_HOST"]
            if "://" not in endpoint_url:
                endpoint_url = "http://" + endpoint_url
            anonymous = True
        if endpoint_url is not None:
            endpoint = urlsplit(endpoint_url)
            if endpoint.scheme not in ("http", "https") or not endpoint.hostname:
                raise ConfigError(
                    f"malformed endpoint_url {endpoint_url!r}: expected http(s)://host[:port]",
                    url=root,
                )
            endpoint_url = endpoint_url.rstrip("/")
        if sum((anonymous, credentials_file is not None, credentials is not None)) > 1:
            raise ConfigError(
                "pass at most one of anonymous=True, credentials_file= and credentials=",
                url=root,
            )
        if credentials_file is not None and not os.path.isfile(credentials_file):
            raise ConfigError(f"credentials_file {credentials_file!r} is not a file", url=root)
        if credentials is not None and not _picklable_function(credentials):
            raise ConfigError(
                "credentials must be a module-level function returning google-auth "
                "credentials (it is pickled to each worker, which calls it)",
                url=root,
            )
        if ca_bundle is not None and not os.path.isfile(ca_bundle):
            raise ConfigError(f"ca_bundle {ca_bundle!r} is not a file", url=root)
        if not anonymous:
            _require_google_auth(root)
        return cls(
            bucket,
            prefix,
            endpoint_url,
            anonymous,
            credentials_file,
            credentials,
            ca_bundle,
            verify_checksums,
        )

    @property
    def route(self) -> GcsRoute:
        endpoint = urlsplit(self.endpoint_url or DEFAULT_ENDPOINT)
        origin = Origin.from_url(f"{endpoint.scheme}://{endpoint.netloc}")
        return GcsRoute(origin, endpoint.path.rstrip("/"))

    def url_for(self, key: str) -> str:
        return f"gs://{self.bucket}/{self.prefix}{key}"

    def with_root(self, url: str) -> GcsConfig:
        """The same options for another ``gs://bucket/prefix`` (a manifest's folder, say)."""
        other = urlsplit(url)
        if other.scheme.lower() != "gs" or not other.netloc:
            raise ConfigError(f"malformed GCS URL {url!r}: expected gs://bucket/prefix")
        prefix = other.path.lstrip("/")
        if prefix and not prefix.endswith("/"):
            prefix += "/"
        return dataclasses.replace(self, bucket=other.netloc, prefix=prefix)

    def resolved(self) -> GcsConfig:
        return self  # credentials are each process's own: nothing to resolve here

    def open(self, fetch: FetchConfig) -> GcsStore:
        return GcsStore(self, fetch)

    def __str__(self) -> str:
        return self.url_for("")


def _picklable_function(function: object) -> bool:
    if not callable(function):
        return False
    try:
        pickle.dumps(function)
    except (pickle.PicklingError, AttributeError, TypeError):
        return False
    return True


def _require_google_auth(url: str) -> None:
    try:
        import google.auth  # noqa: F401
    except ImportError as exc:
        raise ConfigError(
            "reading gs:// with credentials needs google-auth: pip install "
            "'concurrent-loader[gcs]' (or pass anonymous=True for a public bucket)",
            url=url,
        ) from exc


class GcsStore:
    """GETs objects (or byte ranges) of one bucket. Open and use it inside one event loop."""

    capabilities = _CAPABILITIES

    def __init__(self, config: GcsConfig, fetch: FetchConfig) -> None:
        self.config = config
        self._fetch = fetch
        route = config.route
        self._origin = route.origin
        self._objects = f"{route.path_prefix}/storage/v1/b/{quote(config.bucket, safe='')}/o"
        proxy = _environ_proxy(self._origin)
        self._transport = ConnectionPool(
            max_connections=fetch.max_connections,
            timeouts=fetch.timeouts,
            ssl_context=(
                ssl_context_for(fetch, config.ca_bundle) if self._origin.scheme == "https" else None
            ),
            proxy=Proxy.from_url(proxy) if proxy else None,
        )
        self._tokens = (
            None
            if config.anonymous
            else TokenSource(self.url_for(""), config.credentials, config.credentials_file)
        )
        # The transport's digest_for, for a whole body and for a range.
        self._digest_for = (partial(_running, False), partial(_running, True))

    def __repr__(self) -> str:
        return f"GcsStore({self.config}, endpoint={self._origin.host_header})"

    def url_for(self, key: str) -> str:
        return self.config.url_for(key)

    async def _headers(self, url: str) -> Headers:
        tokens = self._tokens
        if tokens is None:
            return ()
        try:
            return await tokens.headers()
        except FetchError as exc:  # one refresh's error, shared by the GETs that waited
            raise exc.for_object(url) from exc.__cause__

    async def get(self, key: str, byte_range: ByteRange | None = None) -> Body:
        url = self.url_for(key)
        target = f"{self._objects}/{quote(self.config.prefix + key, safe='')}?alt=media"
        verify = self.config.verify_checksums
        tokens = self._tokens
        # Most GETs: no token, or one with no refresh due (no coroutine for it).
        headers = () if tokens is None else tokens.current()
        response = await self._transport.get(
            self._origin,
            target,
            headers if headers is not None else await self._headers(url),
            url=url,
            max_bytes=self._fetch.max_object_bytes,
            byte_range=(byte_range.start, byte_range.end) if byte_range else None,
            digest_for=self._digest_for[byte_range is not None] if verify else None,
        )
        if response.status not in (200, 206):
            raise error_for_response(response.status, response.headers, response.body, url)
        body = Body(response.body, response.first_byte_s, response.headers.get("etag"))
        if verify:
            digest = response.digest
            if isinstance(digest, RunningChecksum):
                digest.check(url)
            elif byte_range is not None and not covers_whole_object(response.headers):
                # A part: its checksum is the whole object's, checked once assembled.
                body.object_checksum = http_checksum(response.headers, whole=False)
        return body

    async def list(self) -> AsyncIterator[ObjectInfo]:
        """Every object under the prefix, page by page; a failed page is retried as a GET
        is (``RetryConfig``: transient errors, ``max_attempts``, backoff)."""
        prefix = self.config.prefix
        query = {"fields": "items(name,size),nextPageToken", "maxResults": str(PAGE_SIZE)}
        if prefix:
            query["prefix"] = prefix
        token: str | None = None
        while True:
            page_query = query if token is None else {**query, "pageToken": token}
            page = await self._list_page(f"{self._objects}?{urlencode(page_query)}")
            for item in page.get("items", ()):
                yield ObjectInfo(item["name"][len(prefix) :], int(item["size"]))
            token = page.get("nextPageToken")
            if not token:
                return

    async def _list_page(self, target: str) -> dict[str, Any]:
        url = self.url_for("")
        retry = self._fetch.retry
        rng = random.Random()
        for attempt in range(retry.max_attempts):
            try:
                response = await self._transport.get(
                    self._origin,
                    target,
                    await self._headers(url),
                    url=url,
                    max_bytes=_MAX_PAGE_BYTES,
                )
                return _page(response, url)
            except FetchError as exc:
                if not exc.retryable or attempt + 1 >= retry.max_attempts:
                    raise
                wait = retry.backoff(attempt, rng)
                if isinstance(exc, Throttled):
                    asked = min(exc.retry_after or 0.0, retry.max_delay)  # never longer
                    wait = max(retry.throttle_backoff(attempt, rng), asked)
                await asyncio.sleep(wait)
        raise AssertionError("unreachable")  # pragma: no cover

    async def close(self) -> None:
        await self._transport.close()


def _page(response: Response, url: str) -> dict[str, Any]:
    """One listing page's JSON, or the error its answer is (``stage="list"``)."""
    if response.status != 200:
        raise error_for_response(
            response.status, response.headers, response.body, url, stage="list"
        )
    try:
        page = json.loads(bytes(response.body))
        if not isinstance(page, dict):
            raise ValueError("not an object")
    except ValueError as exc:
        raise FetchError(
            f"a listing page is not JSON: {exc}",
            url=url,
            stage="list",
            cause=Reason.MALFORMED_RESPONSE,
        ) from exc
    return page


def _running(ranged: bool, status: int, headers: dict[str, str]) -> RunningChecksum | None:
    """The transport's ``digest_for``: a fresh check of each successful whole body, fed as
    it arrives (a part's ``x-goog-hash`` is the whole object's: checked once assembled)."""
    if status not in (200, 206) or (ranged and not covers_whole_object(headers)):
        return None
    checksum = http_checksum(headers, whole=True)
    return None if checksum is None else checksum.running()
