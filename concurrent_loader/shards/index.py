"""The index of a tar shard: where each sample member's header and data are.

Format (``<shard>.idx`` next to each shard, written by :mod:`~concurrent_loader.shards.pack`),
one JSON object per shard::

    {"format": "concurrent-loader/tar-index", "version": 1, "size": <shard bytes>,
     "members": [[name, header_offset, data_offset, size], ...]}

A pack of pre-sized images (``pack --resize``) adds two optional keys (the version stays
1): ``"presize"``, the setting's identity, and ``"original_sizes"``, each image member's
upright ``[width, height]`` before pre-sizing (``{"c/x.jpg": [500, 375], ...}``).

``members`` lists the shard's sample members in tar order; ``header_offset`` is the first
byte of the member's headers (pax or long-name header included), so a sample's read can
check the headers it walks against the index. An index is held to its promises when read
(it can describe a tar of its ``size``: :meth:`ShardIndex.check`), when the dataset is made
(the shard's listed size is not larger) and when a sample is read (the walked headers are
exactly its members: :mod:`concurrent_loader.shards.source`). A shard without an index is
scanned once with 4 MiB ranged GETs, up to 8 shards at once (:func:`index_shards`).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from ..config import FetchConfig
from ..errors import ObjectNotFound, Reason, ShardError
from ..fetch import client_for
from ..runtime import Runtime
from ..stores.base import BlockingStore, ByteRange, StoreConfig
from .tar import BLOCK, MAX_SIZE, Member, is_sample_member, padded, scan_members

__all__ = ["INDEX_FORMAT", "INDEX_SUFFIX", "ShardIndex", "index_shards"]

INDEX_FORMAT = "concurrent-loader/tar-index"
INDEX_VERSION = 1
INDEX_SUFFIX = ".idx"
_INDEX_READS_IN_PARALLEL = 32
_SCANS_IN_PARALLEL = 8
_SCAN_WINDOW = 4 << 20  # bytes per ranged GET of a scan


@dataclass(frozen=True)
class ShardIndex:
    """A shard's size when indexed, its sample members in tar order, and for pre-sized
    images the setting's identity and each image's ``(width, height)`` before it."""

    size: int
    members: tuple[Member, ...]
    presize: str | None = None
    original_sizes: Mapping[str, tuple[int, int]] = field(default_factory=dict, hash=False)

    @classmethod
    def of_members(
        cls,
        members: Sequence[Member],
        size: int,
        presize: str | None = None,
        original_sizes: Mapping[str, tuple[int, int]] | None = None,
    ) -> ShardIndex:
        kept = tuple(m for m in members if is_sample_member(m.name))
        return cls(size, kept, presize, dict(original_sizes or {}))

    def to_json(self) -> bytes:
        document: dict[str, object] = {"format": INDEX_FORMAT, "version": INDEX_VERSION}
        document["size"] = self.size
        document["members"] = [[m.name, m.header_offset, m.offset, m.size] for m in self.members]
        if self.presize is not None:
            document["presize"] = self.presize
        if self.original_sizes:
            document["original_sizes"] = {
                name: list(self.original_sizes[name]) for name in sorted(self.original_sizes)
            }
        # ASCII: a member name that is not UTF-8 (a lone surrogate) is written escaped.
        return json.dumps(document, separators=(",", ":")).encode("ascii")

    @classmethod
    def from_json(cls, data: bytes | bytearray, url: str) -> ShardIndex:
        """The index in ``data``, read from ``url``; anything else is a ``ShardError``."""
        try:
            document = json.loads(data)
            if not isinstance(document, dict):
                raise ValueError("not a JSON object")
            if document.get("format") != INDEX_FORMAT or document.get("version") != INDEX_VERSION:
                raise ValueError(f"not a {INDEX_FORMAT} version {INDEX_VERSION} document")
            size = document["size"]
            if not _is_int(size):
                raise ValueError(f"size {size!r} is not an integer")
            members = []
            for entry in document["members"]:
                name, *numbers = entry if isinstance(entry, list) and len(entry) == 4 else [None]
                if not isinstance(name, str) or not all(map(_is_int, numbers)):
                    raise ValueError(f"member {entry!r} is not [name, header, offset, size]")
                members.append(Member(name, *numbers))
            presize = document.get("presize")
            if presize is not None and not isinstance(presize, str):
                raise ValueError(f"presize {presize!r} is not a string")
            original_sizes = _original_sizes(document.get("original_sizes", {}))
            index = cls(size, tuple(members), presize, original_sizes)
        except (ValueError, TypeError, KeyError, RecursionError) as exc:
            raise _mismatch(f"unreadable shard index: {exc}", url) from exc
        index.check(url)
        return index

    def check(self, url: str) -> None:
        """Refuse (``IndexMismatch``, naming the member and offset) an index that cannot
        describe a tar of :attr:`size` bytes: sample members only, headers whole blocks
        before the data, data inside the shard, members in tar order without overlapping."""

        def refuse(member: Member, why: str) -> ShardError:
            return _mismatch(
                f"the index lists member {member.name!r} at offset {member.header_offset} "
                f"(data {member.size} bytes at {member.offset}): {why}",
                url,
            )

        if not 0 <= self.size < MAX_SIZE:
            raise _mismatch(f"the index gives an impossible shard size {self.size}", url)
        next_header = 0
        previous: Member | None = None
        for member in self.members:
            if not is_sample_member(member.name):
                raise refuse(member, "not a sample member's name")
            if member.header_offset < 0 or member.size < 0 or member.offset < 0:
                raise refuse(member, "a negative offset or size")
            headers = member.offset - member.header_offset
            if member.header_offset % BLOCK or headers % BLOCK or headers < BLOCK:
                raise refuse(member, "its header is not whole 512-byte blocks before its data")
            if member.end > self.size:
                raise refuse(member, f"its data ends past the shard's {self.size} bytes")
            if member.header_offset < next_header:
                assert previous is not None
                raise refuse(
                    member,
                    f"it overlaps member {previous.name!r} at offset {previous.header_offset} "
                    "(listed twice, or out of tar order)",
                )
            next_header = padded(member.end)
            previous = member
        unlisted = sorted(set(self.original_sizes) - {m.name for m in self.members})
        if unlisted:
            raise _mismatch(
                f"the index gives original sizes of members it does not list: {unlisted[:10]}",
                url,
            )


def _mismatch(message: str, url: str) -> ShardError:
    return ShardError(message, url=url, stage="index", cause=Reason.INDEX_MISMATCH)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _original_sizes(value: object) -> dict[str, tuple[int, int]]:
    if not isinstance(value, dict):
        raise ValueError(f"original_sizes {value!r} is not an object")
    sizes = {}
    for name, pair in value.items():
        if not (isinstance(pair, list) and len(pair) == 2 and all(_is_int(n) for n in pair)):
            raise ValueError(f"original size {pair!r} of {name!r} is not [width, height]")
        if min(pair) < 1:
            raise ValueError(f"original size {pair!r} of {name!r} is not positive")
        sizes[name] = (pair[0], pair[1])
    return sizes


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

    get: Callable[[str, ByteRange | None], bytes | bytearray]
    if store.capabilities.remote:
        loop_runtime = runtime()

        async def fetch(key: str, byte_range: ByteRange | None) -> bytes:
            client = await client_for(loop_runtime, store, config)
            return bytes(await client.get(key, byte_range))

        def get(key: str, byte_range: ByteRange | None) -> bytes | bytearray:
            return loop_runtime.run(fetch(key, byte_range))
    else:
        opened: BlockingStore = store.open(config)  # type: ignore[assignment]
        get = opened.get_blocking

    def read_index(key: str) -> bytes | bytearray | None:
        with contextlib.suppress(ObjectNotFound):
            return get(key + INDEX_SUFFIX, None)
        return None

    documents: list[bytes | bytearray | None] = []
    pool = concurrent.futures.ThreadPoolExecutor(
        _INDEX_READS_IN_PARALLEL, thread_name_prefix="concurrent-loader-index"
    )
    try:
        for document in pool.map(read_index, shards):
            documents.append(document)
            if on_shard is not None:
                on_shard()
    finally:
        pool.shutdown(cancel_futures=True)

    def scan(i: int) -> ShardIndex:
        key, size, url = shards[i], sizes[i], store.url_for(shards[i])
        if size is None:
            raise _mismatch(f"no index ({key}{INDEX_SUFFIX}) and no listed size to scan by", url)

        def read(offset: int, length: int) -> bytes | bytearray:
            return get(key, ByteRange(offset, offset + length))

        return ShardIndex.of_members(scan_members(read, size, url, _SCAN_WINDOW), size)

    missing = [i for i, document in enumerate(documents) if document is None]
    # A scan is a chain of dependent GETs: scanning shards side by side hides latency.
    with concurrent.futures.ThreadPoolExecutor(
        max_workers=max(1, min(_SCANS_IN_PARALLEL, len(missing))),
        thread_name_prefix="concurrent-loader-scan",
    ) as pool:
        scanned = dict(zip(missing, pool.map(scan, missing), strict=True))
    return [
        ShardIndex.from_json(document, store.url_for(shards[i] + INDEX_SUFFIX))
        if document is not None
        else scanned[i]
        for i, document in enumerate(documents)
    ]
