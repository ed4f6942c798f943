"""One large object (or byte range) read as several ranged GETs in flight, since one GET
runs at one connection's speed. :func:`read_in_parts` keeps ``parts_in_flight`` parts of
``part_size`` bytes in flight and assembles them, in order, into one buffer. Guarantees:

- the result is exactly what a single GET returns: each part must have exactly its length;
- each part is an ordinary GET of the fetch client (retried, limited, timed); parts start
  in byte order;
- a part that fails for good fails the read at once: the others are cancelled and
  awaited, and the error keeps its type and names the object and the part's bytes;
- a whole object is read to its listed size; a one-byte GET past it checks that it has not
  grown (if so, it is read again with one GET);
- the parts are of one version (else ``IntegrityError``, ``OBJECT_CHANGED``), and a
  whole-object checksum they carry is checked once assembled, on a thread; either failure
  reads it again, up to ``RetryConfig.max_attempts`` reads.

The caller reserves :meth:`PartsConfig.reservation` in the byte budget before calling.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from ..config import check_count
from ..errors import BadRequest, FetchError, IncompleteBody, IntegrityError, Reason
from ..stores.base import ByteRange
from ..stores.checksum import Checksum
from .client import FetchClient
from .hooks import NO_OBSERVER, FetchObserver

__all__ = ["DEFAULT_PART_SIZE", "PartsConfig", "read_in_parts"]

DEFAULT_PART_SIZE = 8 * 1024 * 1024
DEFAULT_PARTS_IN_FLIGHT = 8

# What the store said of one part: its ETag and the whole object's checksum.
_Said = tuple[str | None, Checksum | None]


@dataclass(frozen=True)
class PartsConfig:
    """Reads larger than ``part_size`` bytes go as ranged GETs of ``part_size`` bytes,
    ``parts_in_flight`` at a time (when the store supports ranges); ``enabled=False`` reads
    every object with one GET."""

    part_size: int = DEFAULT_PART_SIZE
    parts_in_flight: int = DEFAULT_PARTS_IN_FLIGHT
    enabled: bool = True

    def __post_init__(self) -> None:
        check_count("part_size", self.part_size)
        check_count("parts_in_flight", self.parts_in_flight)

    def applies(self, size: int | None) -> bool:
        """Whether a read of ``size`` expected bytes goes in parts."""
        return self.enabled and size is not None and size > self.part_size

    def reservation(self, size: int) -> int:
        """The most bytes a read of ``size`` in parts holds: its buffer and parts in flight."""
        parts = -(-size // self.part_size)
        return size + min(self.parts_in_flight, parts) * self.part_size


def split(span: ByteRange, part_size: int) -> list[ByteRange]:
    """``span`` cut into consecutive parts of ``part_size`` bytes (the last may be shorter)."""
    return [
        ByteRange(start, min(start + part_size, span.end))
        for start in range(span.start, span.end, part_size)
    ]


def _naming_part(
    exc: FetchError, url: str, part: ByteRange, index: int, count: int, span: ByteRange
) -> FetchError:
    """A copy of ``exc`` (same type, cause and code) whose message names the part's bytes."""
    where = (
        f"bytes {part.start}-{part.end - 1} (part {index + 1} of {count} of the read of "
        f"bytes {span.start}-{span.end - 1})"
    )
    named = type(exc)(
        f"{exc.message}; {where}" if exc.message else where,
        url=exc.url or url,
        stage=exc.stage,
        cause=exc.cause,
        status=exc.status,
        code=exc.code,
    )
    for note in getattr(exc, "__notes__", ()):
        named.add_note(note)
    return named


async def read_in_parts(
    client: FetchClient,
    key: str,
    byte_range: ByteRange | None,
    size: int,
    config: PartsConfig,
    *,
    observer: FetchObserver = NO_OBSERVER,
) -> bytearray:
    """``byte_range`` of ``key`` (the whole object of ``size`` bytes when None) in parts."""
    reads = client.config.retry.max_attempts
    for read in range(1, reads + 1):
        said: list[_Said] = []
        buffer = await _read_once(client, key, byte_range, size, config, observer, said)
        try:
            await _check_assembled(buffer, said, client.store.url_for(key), byte_range is None)
        except IntegrityError as exc:
            if read == reads:
                if reads > 1:
                    exc.add_note(f"gave up after {reads} reads in parts")
                raise
            observer.on_retry(exc)
            continue
        return buffer
    raise AssertionError("unreachable")


async def _check_assembled(
    buffer: bytearray, said: list[_Said], url: str, whole_object: bool
) -> None:
    """``IntegrityError`` unless the parts are of one version, with the checksum carried."""
    etags = {etag for etag, _ in said if etag is not None}
    if len(etags) > 1:
        raise IntegrityError(
            f"its parts came from {len(etags)} versions of the object (ETags "
            f"{', '.join(sorted(etags))}): it changed while it was read",
            url=url,
            stage="fetch",
            cause=Reason.OBJECT_CHANGED,
        )
    checksum = next((checksum for _, checksum in said if checksum is not None), None)
    if whole_object and checksum is not None:
        # Tens to hundreds of MB: off the event loop (hashlib lets go of the GIL).
        await asyncio.to_thread(checksum.check, buffer, url)


async def _read_once(
    client: FetchClient,
    key: str,
    byte_range: ByteRange | None,
    size: int,
    config: PartsConfig,
    observer: FetchObserver,
    said: list[_Said],
) -> bytearray:
    """One read in parts; what the store said of each part is added to ``said``."""
    span = byte_range if byte_range is not None else ByteRange(0, size)
    parts = split(span, config.part_size)
    buffer = bytearray(span.length)
    url = client.store.url_for(key)
    queue: Iterator[tuple[int, ByteRange]] = iter(enumerate(parts))

    async def fetch_parts() -> None:
        for index, part in queue:
            try:
                body = await client.get_body(key, part, observer=observer)
                data = body.data
                said.append((body.etag, body.object_checksum))
                if len(data) != part.length:
                    raise IncompleteBody(
                        f"{len(data)} bytes instead of {part.length}",
                        url=url,
                        stage="fetch",
                        cause=Reason.INCOMPLETE_BODY,
                    )
            except FetchError as exc:
                raise _naming_part(exc, url, part, index, len(parts), span) from exc
            offset = part.start - span.start
            buffer[offset : offset + part.length] = data

    tasks: list[asyncio.Future[Any]] = [
        asyncio.ensure_future(fetch_parts()) for _ in range(min(config.parts_in_flight, len(parts)))
    ]
    grew: asyncio.Future[bool] | None = None
    if byte_range is None:
        grew = asyncio.ensure_future(_grew_past(client, key, size, observer))
        tasks.append(grew)
    try:
        await asyncio.gather(*tasks)  # raises the first failure at once
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    if grew is not None and grew.result():
        said.clear()
        return bytearray(await client.get(key, observer=observer))
    return buffer


async def _grew_past(client: FetchClient, key: str, size: int, observer: FetchObserver) -> bool:
    """Whether the object holds a byte at offset ``size`` (S3 answers 416 when not)."""
    try:
        data = await client.get(key, ByteRange(size, size + 1), observer=observer)
    except FetchError as exc:
        if isinstance(exc, BadRequest) and exc.status == 416:
            return False
        exc.add_note(f"while checking for a byte past the listed size, {size} bytes")
        raise
    return len(data) > 0
