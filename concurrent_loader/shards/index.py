"""The index of a tar shard: where each sample member's header and data are.

Format (written by :mod:`~concurrent_loader.shards.pack` next to each shard, as
``<shard>.idx``, e.g. ``shard-000000.tar`` + ``shard-000000.tar.idx``): one UTF-8 JSON
object per shard::

    {"format": "concurrent-loader/tar-index", "version": 1, "size": <shard bytes>,
     "members": [[name, header_offset, data_offset, size], ...]}

``members`` lists the shard's sample members (regular files that ``webdataset`` groups
into samples, see :mod:`~concurrent_loader.shards.tar`) in tar order; ``header_offset`` is
the first byte of the member's headers (a pax or long-name header included), so a sample
read from its first header to its last member's end can be checked header by header. One
small file per shard keeps shards independent: a shard and its index are copied, listed
and replaced together.

A shard without an index is indexed once by scanning it with ranged GETs
(:func:`index_shards`), 4 MiB at a time, stepping over members larger than that, up to 8
shards at once.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..config import FetchConfig
from ..errors import ObjectNotFound, Reason, ShardError
from ..fetch import client_for
from ..runtime import Runtime
from ..stores.base import BlockingStore, ByteRange, StoreConfig
from .tar import Member, is_sample_member, scan_members

__all__ = ["INDEX_FORMAT", "INDEX_SUFFIX", "ShardIndex", "index_shards"]

INDEX_FORMAT = "concurrent-loader/tar-index"
INDEX_VERSION = 1
INDEX_SUFFIX = ".idx"
_SCANS_IN_PARALLEL = 8
_SCAN_WINDOW = 4 << 20  # bytes per ranged GET of a scan


@dataclass(frozen=True)
class ShardIndex:
    """A shard's size when indexed, and its sample members in tar order."""

    size: int
    members: tuple[Member, ...]

    @classmethod
    def of_members(cls, members: Sequence[Member], size: int) -> ShardIndex:
        return cls(size, tuple(m for m in members if is_sample_member(m.name)))

    def to_json(self) -> bytes:
        members = [[m.name, m.header_offset, m.offset, m.size] for m in self.members]
        document = {
            "format": INDEX_FORMAT,
            "version": INDEX_VERSION,
            "size": self.size,
            "members": members,
        }
        return json.dumps(document, separators=(",", ":"), ensure_ascii=False).encode("utf-8")

    @classmethod
    def from_json(cls, data: bytes | bytearray, url: str) -> ShardIndex:
        """The index in ``data``, read from ``url``; anything else is a ``ShardError``."""
        try:
            document = json.loads(data)
            if document.get("format") != INDEX_FORMAT or document.get("version") != INDEX_VERSION:
                raise ValueError(f"not a {INDEX_FORMAT} version {INDEX_VERSION} document")
            members = tuple(
                Member(str(name), int(header), int(offset), int(size))
                for name, header, offset, size in document["members"]
            )
            return cls(int(document["size"]), members)
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            raise ShardError(
                f"unreadable shard index: {exc}",
                url=url,
                stage="index",
                cause=Reason.INDEX_MISMATCH,
            ) from exc


def index_shards(
    store: StoreConfig,
    config: FetchConfig,
    shards: Sequence[str],
    sizes: Sequence[int | None],
    runtime: Callable[[], Runtime],
    on_shard: Callable[[], None] | None = None,
) -> list[ShardIndex]:
    """The index of each shard: its ``.idx`` object when there is one, else a scan of the
    shard (``sizes[i]``, from a listing, is needed to scan shard ``i``)."""
    if not store.capabilities.remote:
        opened: BlockingStore = store.open(config)  # type: ignore[assignment]
        found = []
        for key, size in zip(shards, sizes, strict=True):
            try:
                data = opened.get_blocking(key + INDEX_SUFFIX)
            except ObjectNotFound:

                def read(offset: int, length: int, key: str = key) -> bytes:
                    return opened.get_blocking(key, ByteRange(offset, offset + length))

                found.append(_scan(store, key, size, read))
            else:
                found.append(ShardIndex.from_json(data, store.url_for(key + INDEX_SUFFIX)))
            if on_shard is not None:
                on_shard()
        return found
    loop_runtime = runtime()

    async def fetch_indexes() -> list[bytes | None]:
        client = await client_for(loop_runtime, store, config)
        limit = asyncio.Semaphore(32)

        async def one(key: str) -> bytes | None:
            data: bytes | None = None
            async with limit:
                with contextlib.suppress(ObjectNotFound):
                    data = bytes(await client.get(key + INDEX_SUFFIX))
            if on_shard is not None:
                on_shard()
            return data

        return list(await asyncio.gather(*(one(key) for key in shards)))

    async def read_range(key: str, offset: int, length: int) -> bytes:
        client = await client_for(loop_runtime, store, config)
        return bytes(await client.get(key, ByteRange(offset, offset + length)))

    def scan(key: str, size: int | None) -> ShardIndex:
        # On a thread of ours, one window per ranged GET on the runtime's loop.
        def read(offset: int, length: int) -> bytes:
            return loop_runtime.run(read_range(key, offset, length))

        return _scan(store, key, size, read)

    documents = loop_runtime.run(fetch_indexes())
    missing = [i for i, document in enumerate(documents) if document is None]
    scanned: dict[int, ShardIndex] = {}
    if missing:
        # Shards without an index are scanned a few at a time: each scan is a chain of
        # dependent GETs, so concurrency across shards is what hides the latency.
        with concurrent.futures.ThreadPoolExecutor(
            max_workers=min(_SCANS_IN_PARALLEL, len(missing)),
            thread_name_prefix="concurrent-loader-scan",
        ) as pool:
            futures = {i: pool.submit(scan, shards[i], sizes[i]) for i in missing}
            scanned = {i: future.result() for i, future in futures.items()}
    return [
        scanned[i]
        if document is None
        else ShardIndex.from_json(document, store.url_for(shards[i] + INDEX_SUFFIX))
        for i, document in enumerate(documents)
    ]


def _scan(
    store: StoreConfig, key: str, size: int | None, read: Callable[[int, int], bytes]
) -> ShardIndex:
    url = store.url_for(key)
    if size is None:
        raise ShardError(
            f"no index ({key}{INDEX_SUFFIX}) and no listed size to scan the shard by",
            url=url,
            stage="index",
            cause=Reason.INDEX_MISMATCH,
        )
    return ShardIndex.of_members(scan_members(read, size, url, _SCAN_WINDOW), size)
