"""The Azure Blob Storage backend: :class:`AzureConfig` (``az://container/prefix`` and how to
reach it; credentials and endpoint found by :mod:`.credentials`) and :class:`AzureStore`:
Get Blob (whole, or a range in ``x-ms-range``) and List Blobs, sent through the pooled
transport and authorised by the config's credential (:mod:`.auth`): a Shared Key signature
(:mod:`.sharedkey`), a SAS token in the query, an Entra ID bearer token (:mod:`.entra`), or
nothing.

A body is checked against the blob's MD5 as it arrives (``verify_checksums``): a whole blob
against ``Content-MD5``; a range covering the whole blob against ``x-ms-blob-content-md5``
(the blob's); any other range carries the blob's MD5 as ``Body.object_checksum``, checked
once the parts are assembled. A blob stored without an MD5 is not checked.
"""

from __future__ import annotations

import asyncio
import binascii
import dataclasses
import os
import random
import xml.etree.ElementTree as ET
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any
from urllib.parse import quote, unquote, urlsplit

from ...config import FetchConfig
from ...errors import ConfigError, FetchError, Reason, Throttled
from ...transport import ConnectionPool, DigestFor, Origin, Proxy, Response
from ...transport.errors import framing_error
from ...transport.parser import FramingError, check_partial
from ...transport.request import range_value
from ..base import Body, ByteRange, Capabilities, ObjectInfo
from ..checksum import Checksum, RunningChecksum, covers_whole_object, http_checksum
from ..http import _environ_proxy
from ..shared import fetch_error, ssl_context_for
from .auth import authorizer_for
from .credentials import (
    BLOB_HOST_SUFFIX,
    AzureCredential,
    AzureRoute,
    EntraId,
    connection_settings,
    find_credential,
    parse_url,
)
from .errors import error_for_response

__all__ = ["AzureConfig", "AzureStore"]

_CAPABILITIES = Capabilities(remote=True, listing=True, ranges=True)

_BLOB_MD5 = "x-ms-blob-content-md5"


@dataclass(frozen=True)
class AzureConfig:
    """``az://container/prefix`` in one storage account, and how to reach it."""

    account: str
    container: str
    prefix: str
    #: ``scheme://host[:port][/path]``: the blob service's base URL, without a trailing ``/``
    endpoint: str
    credential: AzureCredential = field(default_factory=EntraId)
    #: a CA bundle to trust instead of the system's
    ca_bundle: str | None = None
    #: check bodies against ``Content-MD5`` (whole blobs) and ``x-ms-blob-content-md5`` (ranges)
    verify_checksums: bool = True

    @property
    def capabilities(self) -> Capabilities:
        return _CAPABILITIES

    @property
    def route(self) -> AzureRoute:
        parts = urlsplit(self.endpoint)
        return AzureRoute(Origin.from_url(self.endpoint), parts.path.rstrip("/"))

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        account_name: str | None = None,
        account_key: str | None = None,
        sas_token: str | None = None,
        connection_string: str | None = None,
        credential: Any = None,
        anonymous: bool = False,
        endpoint_url: str | None = None,
        ca_bundle: str | None = None,
        verify_checksums: bool = True,
        environ: Mapping[str, str] | None = None,
    ) -> AzureConfig:
        """The config for ``az://container/prefix`` or
        ``https://<account>.blob.core.windows.net/container/prefix`` (credentials and
        endpoint as :mod:`.credentials` says; ``environ`` defaults to ``os.environ``)."""
        env = os.environ if environ is None else environ
        container, prefix, url_account, url_endpoint = parse_url(url)
        given = [
            name
            for name, value in (
                ("account_key", account_key),
                ("sas_token", sas_token),
                ("connection_string", connection_string),
                ("credential", credential),
                ("anonymous", anonymous or None),
            )
            if value is not None
        ]
        if len(given) > 1:
            raise ConfigError(f"give one Azure credential, not {' and '.join(given)}", url=url)
        made = hasattr(credential, "get_token") and not isinstance(credential, type)
        if credential is not None and (made or not callable(credential)):
            raise ConfigError(
                "credential= takes what makes the credential in each process (a class such as "
                "azure.identity.ManagedIdentityCredential, or a function), not a credential",
                url=url,
            )
        if connection_string is None and not given:
            connection_string = env.get("AZURE_STORAGE_CONNECTION_STRING") or None
        settings = connection_settings(connection_string) if connection_string else {}
        account = account_name or url_account or settings.get("account")
        account = account or env.get("AZURE_STORAGE_ACCOUNT")
        if not account:
            raise ConfigError(
                f"no Azure storage account for {url!r}: pass account_name=, set "
                "AZURE_STORAGE_ACCOUNT or AZURE_STORAGE_CONNECTION_STRING, or give the "
                "https://<account>.blob.core.windows.net/ URL",
                url=url,
            )
        if settings and settings["account"] != account:
            if connection_string is not None and "connection_string" in given:
                raise ConfigError(
                    f"the connection string is for account {settings['account']!r}, "
                    f"not {account!r}",
                    url=url,
                )
            settings = {}  # the environment's string is for another account
        endpoint = (
            endpoint_url
            or url_endpoint
            or settings.get("endpoint")
            or f"https://{account}{BLOB_HOST_SUFFIX}"
        ).rstrip("/")
        parts = urlsplit(endpoint)
        if parts.scheme not in ("http", "https") or not parts.hostname or parts.query:
            raise ConfigError(
                f"malformed Azure endpoint {endpoint!r}: expected http(s)://host[:port][/path]",
                url=url,
            )
        Origin.from_url(endpoint)  # validates host and port
        found = find_credential(account_key, sas_token, credential, anonymous, settings, env)
        if ca_bundle is not None and not os.path.isfile(ca_bundle):
            raise ConfigError(f"ca_bundle {ca_bundle!r} is not a file")
        return cls(account, container, prefix, endpoint, found, ca_bundle, verify_checksums)

    def url_for(self, key: str) -> str:
        return f"az://{self.container}/{self.prefix}{key}"

    def with_root(self, url: str) -> AzureConfig:
        """The same account, endpoint and credential for another ``az://container/prefix``
        (a manifest's folder, say); a URL naming another account is refused."""
        container, prefix, account, _ = parse_url(url)
        if account is not None and account != self.account:
            raise ConfigError(
                f"{url!r} is in account {account!r}, not {self.account!r}: give its own config"
            )
        return dataclasses.replace(self, container=container, prefix=prefix)

    def resolved(self) -> AzureConfig:
        return self

    def open(self, fetch: FetchConfig) -> AzureStore:
        return AzureStore(self, fetch)

    def container_path(self) -> str:
        """The container's request path: the endpoint's path, then ``/container``."""
        return f"{self.route.path_prefix}/{quote(self.container, safe='')}"

    def __str__(self) -> str:
        return self.url_for("")


class AzureStore:
    """GETs blobs (or byte ranges) of one container. Open and use it inside one event loop."""

    def __init__(self, config: AzureConfig, fetch: FetchConfig) -> None:
        self.config = config
        self.capabilities: Capabilities = config.capabilities
        self._fetch = fetch
        route = config.route
        self._origin = route.origin
        self._container_path = config.container_path()
        self._blob_base = self._container_path + "/" + quote(config.prefix, safe="/~")
        self._auth = authorizer_for(config.credential, config.account, self.url_for(""))
        tls = self._origin.tls
        proxy = _environ_proxy(self._origin)
        self._transport = ConnectionPool(
            max_connections=fetch.max_connections,
            timeouts=fetch.timeouts,
            ssl_context=ssl_context_for(fetch, config.ca_bundle) if tls else None,
            proxy=Proxy.from_url(proxy) if proxy else None,
        )
        # The transport's digest_for, for a whole body and for a range.
        self._digest_for: tuple[DigestFor, DigestFor] | None = None
        if config.verify_checksums:
            self._digest_for = (partial(_running, False), partial(_running, True))
        self._rng = random.Random()

    def __repr__(self) -> str:
        return f"AzureStore({self.config}, account={self.config.account!r})"

    def url_for(self, key: str) -> str:
        return self.config.url_for(key)

    async def _send(
        self,
        path: str,
        query: Sequence[tuple[str, str]],
        url: str,
        span: tuple[int, int] | None = None,
        max_bytes: int | None = None,
        digest_for: DigestFor | None = None,
    ) -> Response:
        x_ms = [("x-ms-range", range_value(span))] if span else []
        headers = await self._auth.headers(path, query, x_ms)
        params = [f"{name}={quote(value, safe='')}" for name, value in query]
        if self._auth.query_suffix:
            params.append(self._auth.query_suffix)
        target = path + "?" + "&".join(params) if params else path
        return await self._transport.get(
            self._origin, target, headers, url=url, max_bytes=max_bytes, digest_for=digest_for
        )

    async def get(self, key: str, byte_range: ByteRange | None = None) -> Body:
        url = self.url_for(key)
        path = self._blob_base + quote(key, safe="/~")
        digest_for = None
        if self._digest_for is not None:
            digest_for = self._digest_for[byte_range is not None]
        span = (byte_range.start, byte_range.end) if byte_range else None
        response = await self._send(
            path, (), url, span, max_bytes=self._fetch.max_object_bytes, digest_for=digest_for
        )
        if response.status not in (200, 206):
            raise error_for_response(response.status, response.headers, response.body, url)
        if span is not None:
            _check_range(response, span, url)
        headers = response.headers
        body = Body(response.body, response.first_byte_s, headers.get("etag"))
        if isinstance(response.digest, RunningChecksum):
            response.digest.check(url)
        elif byte_range is not None and self.config.verify_checksums:
            # A part: its checksum is the blob's, checked once the parts are assembled.
            body.object_checksum = _blob_md5(headers)
        return body

    async def list(self) -> AsyncIterator[ObjectInfo]:
        """Every blob under the prefix, page by page (List Blobs, ``marker`` pagination)."""
        prefix = self.config.prefix
        url = self.url_for("")
        marker = ""
        while True:
            query = [("comp", "list"), ("restype", "container")]
            if prefix:
                query.append(("prefix", prefix))
            if marker:
                query.append(("marker", marker))
            page = await self._list_page(query, url)
            try:
                root = ET.fromstring(bytes(page))
            except ET.ParseError as exc:
                message = f"malformed List Blobs answer: {exc}"
                raise fetch_error(FetchError, message, url, Reason.MALFORMED_RESPONSE) from exc
            for blob in root.iterfind("Blobs/Blob"):
                name = blob.find("Name")
                size = blob.findtext("Properties/Content-Length", "0")
                if name is None or name.text is None:
                    continue
                text = unquote(name.text) if name.get("Encoded") == "true" else name.text
                yield ObjectInfo(text[len(prefix) :], int(size))
            marker = root.findtext("NextMarker") or ""
            if not marker:
                return

    async def _list_page(self, query: Sequence[tuple[str, str]], url: str) -> bytes | bytearray:
        """One page, retried as the fetch client retries a GET (transient errors only)."""
        retry = self._fetch.retry
        failures = throttles = 0
        while True:
            try:
                response = await self._send(self._container_path, query, url)
                if response.status == 200:
                    return response.body
                raise error_for_response(
                    response.status, response.headers, response.body, url, stage="list"
                )
            except FetchError as error:
                if isinstance(error, Throttled):
                    throttles += 1
                    delay = retry.throttle_backoff(throttles - 1, self._rng)
                else:
                    failures += 1
                    delay = retry.backoff(failures - 1, self._rng)
                if not error.retryable or failures >= retry.max_attempts or throttles > 10:
                    raise
            await asyncio.sleep(delay)

    async def close(self) -> None:
        await self._transport.close()
        self._auth.close()


def _check_range(response: Response, span: tuple[int, int], url: str) -> None:
    """The transport's own check of an answer to a ranged GET (the range goes in
    ``x-ms-range``, as the SDK sends it, so the transport is not told of it), after one
    translation: Azurite answers a range starting at or past the blob's end with an empty
    ``206`` (``bytes N-(N-1)/N``) where the service answers ``416 InvalidRange``; both are
    that ``416``, which tells a ranged read that the blob did not grow."""
    total = response.headers.get("content-range", "").rpartition("/")[2]
    if response.status == 206 and total.isdigit() and span[0] >= int(total):
        raise error_for_response(416, {"x-ms-error-code": "InvalidRange"}, b"", url)
    try:
        check_partial(response.status, response.headers, len(response.body), span)
    except FramingError as exc:
        raise framing_error(url, exc) from exc


def _blob_md5(headers: Mapping[str, str]) -> Checksum | None:
    """The whole blob's MD5 sent with a range (``x-ms-blob-content-md5``), if any."""
    value = headers.get(_BLOB_MD5)
    if value is None:
        return None
    try:
        digest = binascii.a2b_base64(value.strip(), strict_mode=True)
    except (binascii.Error, ValueError):
        return None
    return Checksum("md5", digest, _BLOB_MD5) if len(digest) == 16 else None


def _running(ranged: bool, status: int, headers: dict[str, str]) -> RunningChecksum | None:
    """The transport's ``digest_for``: a fresh check of each successful body that is the
    whole blob, fed as it arrives, against the blob's MD5."""
    if status not in (200, 206):
        return None
    if not ranged:
        checksum = http_checksum(headers, whole=True)  # Content-MD5
    elif covers_whole_object(headers):
        checksum = _blob_md5(headers)
    else:
        return None
    return None if checksum is None else checksum.running()
