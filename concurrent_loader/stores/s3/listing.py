"""Listing an S3 prefix, for :class:`~.store.S3Store`, two ways.

* :class:`S3Lister`: every object under the root, page after page, through aiobotocore
  (the control plane): one client per store, made on first use on the store's loop and
  closed with the store; a failure is the error tree's class naming the prefix
  (``s3://bucket/prefix/``), stage ``list``.
* :func:`page_query` and :func:`parse_page`: one ``ListObjectsV2`` page (by level, with
  ``delimiter=/``, or not) as the store sends it through its own transport, signed by its
  signer, and reads it by splitting and regular expressions when it is written as S3
  servers write it, else with the C XML parser: both far cheaper per key than botocore's
  parser, whose cost is what bounds a parallel listing of a large root.
"""

from __future__ import annotations

import asyncio
import re
import xml.etree.ElementTree as ET
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, unquote_plus

from ...config import FetchConfig
from ...errors import ConnectionFailed, FetchError, Reason
from ..base import Level, ObjectInfo
from .credentials import CredentialSource, redact_botocore_logs
from .errors import error_for_exception, refused_certificate
from .route import S3Route

__all__ = ["Bucket", "S3Lister", "page_query", "parse_page"]


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

    async def pages(self, prefix: str) -> AsyncIterator[dict[str, Any]]:
        """The ``ListObjectsV2`` pages of every object under ``prefix`` (relative to the root)."""
        url = self._config.url_for(prefix)
        arguments = {"Bucket": self._config.bucket, "Prefix": self._config.prefix + prefix}
        try:
            client = await self._opened()
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


def page_query(
    prefix: str, *, delimited: bool, token: str | None = None, max_keys: int | None = None
) -> str:
    """The canonical query (encoded, sorted: what SigV4 signs and what is sent) of one
    ``ListObjectsV2`` page of ``prefix`` (from the bucket's root), keys URL-encoded in the
    answer (as botocore asks, so any key survives XML)."""
    params = {"list-type": "2", "prefix": prefix, "encoding-type": "url"}
    if delimited:
        params["delimiter"] = "/"
    if token is not None:
        params["continuation-token"] = token
    if max_keys is not None:
        params["max-keys"] = str(max_keys)
    return "&".join(
        f"{quote(name, safe='-_.~')}={quote(value, safe='-_.~')}"
        for name, value in sorted(params.items())
    )


#: how S3 servers begin a page: an optional declaration (UTF-8), then the root element
_START = re.compile(
    rb'\s*(?:<\?xml version="1\.[01]"(?: encoding="(?i:utf-8)")?(?: standalone="(?:yes|no)")?'
    rb"\s*\?>\s*)?<ListBucketResult[\s>]"
)
#: CDATA, comments, a DTD, prefixed names: a page the tree reads
_UNUSUAL = (b"<!", b":Contents>", b":Key>", b":Size>", b":Prefix>", b":CommonPrefixes>")
#: one of the elements read here with whitespace, attributes or "/" in its tag
_ODD_TAG = re.compile(
    rb"</?(?:Contents|CommonPrefixes|Key|Size|Prefix|IsTruncated|EncodingType"
    rb"|NextContinuationToken)[^>\w.:-]"
)
_ELEMENT = re.compile(rb"<(Key|Size)>([^<]*)</\1>")
_TOP = re.compile(rb"<(EncodingType|IsTruncated|NextContinuationToken)>([^<]*)</\1>")
_PREFIX = re.compile(rb"<CommonPrefixes>\s*<Prefix>([^<]*)</Prefix>\s*</CommonPrefixes>")


class _NotPlain(Exception):
    """The page is not plainly written: the tree reads it."""


def _plain_page(body: bytes, root: str) -> tuple[Level, str | None] | None:
    """:func:`parse_page` by splitting and regular expressions, several times less CPU per
    key than the tree (which bounds a parallel listing of a large root), for a page written
    as S3 servers write it: UTF-8, elements without attributes or whitespace in their tags,
    no entity, character reference or carriage return in a key, prefix or token, one
    processing instruction at most (the declaration). None for any other page: the tree
    reads it. The tests check both readings equal."""
    start = _START.match(body)
    if start is None or b"<?" in body[start.end() :] or any(m in body for m in _UNUSUAL):
        return None
    if _ODD_TAG.search(body):
        return None
    try:
        return _read_plain(body, root)
    except _NotPlain:
        return None


def _read_plain(body: bytes, root: str) -> tuple[Level, str | None]:
    head, *blocks = body.split(b"<Contents>")
    outside = [head]
    fields = []
    for block in blocks:
        inside, end, after = block.partition(b"</Contents>")
        found = _ELEMENT.findall(inside)
        if not end or len(found) != 2 or found[0][0] == found[1][0]:
            raise _NotPlain
        fields.append(found)
        outside.append(after)
    rest = b"".join(outside)
    listed = _TOP.findall(rest)
    top = dict(listed)
    if len(top) != len(listed):
        raise _NotPlain  # an element twice
    url_encoded = top.get(b"EncodingType") == b"url"
    cut = len(root)

    def text(raw: bytes) -> str:
        if b"&" in raw or b"\r" in raw:
            raise _NotPlain  # XML's unescaping and line ends: the tree's
        try:
            return raw.decode()
        except UnicodeDecodeError:
            raise _NotPlain from None

    def name(raw: bytes) -> str:  # a key or prefix, URL-decoded if the server says so
        return (unquote_plus(text(raw)) if url_encoded else text(raw))[cut:]

    objects = []
    for (first, a), (_, b) in fields:
        key, size = (a, b) if first == b"Key" else (b, a)
        if not size.isdigit():
            raise _NotPlain
        objects.append(ObjectInfo(name(key), int(size)))
    prefixes = [name(raw) for raw in _PREFIX.findall(rest)]
    if rest.count(b"<CommonPrefixes>") != len(prefixes):
        raise _NotPlain
    flag = top.get(b"IsTruncated", b"false").lower()
    if flag not in (b"true", b"false"):
        raise _NotPlain
    truncated = flag == b"true"
    token = top.get(b"NextContinuationToken") if truncated else None
    if truncated and not token:
        raise _NotPlain  # the tree raises the error
    return Level(objects, prefixes, truncated), text(token) if token else None


def parse_page(body: bytes | bytearray, root: str, url: str) -> tuple[Level, str | None]:
    """One ``ListObjectsV2`` answer: its objects and common prefixes (relative to ``root``,
    the bucket's prefix), ``truncated`` when more pages follow, and the next page's token.
    A body that is not such an answer is ``ConnectionFailed`` (``MALFORMED_RESPONSE``)
    naming ``url``."""
    plain = _plain_page(bytes(body), root)
    return plain if plain is not None else _tree_page(body, root, url)


def _tree_page(body: bytes | bytearray, root: str, url: str) -> tuple[Level, str | None]:
    try:
        tree = ET.fromstring(bytes(body))
    except ET.ParseError as exc:
        raise ConnectionFailed(
            f"a listing page that is not XML: {exc}",
            url=url,
            stage="list",
            cause=Reason.MALFORMED_RESPONSE,
        ) from exc
    tag = tree.tag
    ns = tag[: tag.index("}") + 1] if tag.startswith("{") else ""
    if tag != ns + "ListBucketResult":
        raise ConnectionFailed(
            f"a listing page whose root is {tag[:100]!r}",
            url=url,
            stage="list",
            cause=Reason.MALFORMED_RESPONSE,
        )
    # Keys are URL-encoded only if the server says so (as botocore decodes them).
    decode = unquote_plus if tree.findtext(ns + "EncodingType") == "url" else _same
    cut = len(root)
    key_tag, size_tag = ns + "Key", ns + "Size"
    objects = [
        ObjectInfo(decode(item.findtext(key_tag) or "")[cut:], int(item.findtext(size_tag) or 0))
        for item in tree.iterfind(ns + "Contents")
    ]
    prefixes = [
        decode(item.findtext(ns + "Prefix") or "")[cut:]
        for item in tree.iterfind(ns + "CommonPrefixes")
    ]
    truncated = (tree.findtext(ns + "IsTruncated") or "").strip().lower() == "true"
    token = tree.findtext(ns + "NextContinuationToken") if truncated else None
    if truncated and not token:
        raise ConnectionFailed(
            "a truncated listing page without a continuation token",
            url=url,
            stage="list",
            cause=Reason.MALFORMED_RESPONSE,
        )
    return Level(objects, prefixes, truncated), token


def _same(text: str) -> str:
    return text
