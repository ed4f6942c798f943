"""The index of a tar shard: where each sample member's header and data are.

Format (written by :mod:`~concurrent_loader.shards.pack` next to each shard, as
``<shard>.idx``, e.g. ``shard-000000.tar`` + ``shard-000000.tar.idx``): one UTF-8 JSON
object per shard::

    {"format": "concurrent-loader/tar-index", "version": 1, "size": <shard bytes>,
     "members": [[name, header_offset, data_offset, size], ...]}

A pack of pre-sized images (``pack --resize``) adds two keys, which readers of the format
without them ignore (the version stays 1): ``"presize"``, the setting's
:attr:`~concurrent_loader.decode.presize.Presize.identity`, and ``"original_sizes"``, each
image member's ``[width, height]`` before pre-sizing (upright: after its EXIF
orientation)::

    "presize": "presize-v1:jpeg:256:q90", "original_sizes": {"c/x.jpg": [500, 375], ...}

``members`` lists the shard's sample members (regular files that ``webdataset`` groups
into samples, see :mod:`~concurrent_loader.shards.tar`) in tar order; ``header_offset`` is
the first byte of the member's headers (a pax or long-name header included), so the
headers a sample's read walks can be checked against the index, member by member. One
small file per shard keeps shards independent: a shard and its index are copied, listed
and replaced together.

What an index promises, and how it is held to it: when read, that it can describe a tar
of its ``size`` (members in tar order, not overlapping, inside the shard:
:meth:`ShardIndex.check`); when the dataset is made, that the shard's listed size is
not larger (a shard grown since, re-packed or written again without its index, is
refused; in a shorter one, the samples past its end fail as truncated); when a sample is
read, that the shard's own headers, walked from where the previous sample ends (the
shard's start, for its first sample) through the next sample's first headers (to the
shard's end, for its last), are exactly the members it lists there, with no sample member
it leaves out (:mod:`concurrent_loader.shards.source`).

A shard without an index is indexed once by scanning it with ranged GETs
(:func:`index_shards`), 4 MiB at a time, stepping over members larger than that, up to 8
shards at once.
"""

from __future__ import annotations

import asyncio
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
_SCANS_IN_PARALLEL = 8
_SCAN_WINDOW = 4 << 20  # bytes per ranged GET of a scan


@dataclass(frozen=True)
class ShardIndex:
    """A shard's size when indexed, and its sample members in tar order; for a pack of
    pre-sized images, the setting's identity and each image member's size ``(width,
    height)`` before it was pre-sized."""

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

    def original_size(self, name: str) -> tuple[int, int] | None:
        """Member ``name``'s ``(width, height)`` before pre-sizing; None when not recorded."""
        return self.original_sizes.get(name)

    def to_json(self) -> bytes:
        members = [[m.name, m.header_offset, m.offset, m.size] for m in self.members]
        document: dict[str, object] = {
            "format": INDEX_FORMAT,
            "version": INDEX_VERSION,
            "size": self.size,
            "members": members,
        }
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
        """The index in ``data``, read from ``url``; anything else is a ``ShardError``, and so
        is an index that cannot describe a tar (see :meth:`check`)."""
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
                if not isinstance(entry, list) or len(entry) != 4:
                    raise ValueError(f"member {entry!r} is not [name, header, offset, size]")
                name, header, offset, length = entry
                if not isinstance(name, str) or not all(
                    _is_int(n) for n in (header, offset, length)
                ):
                    raise ValueError(f"member {entry!r} is not [name, header, offset, size]")
                members.append(Member(name, header, offset, length))
            presize = document.get("presize")
            if presize is not None and not isinstance(presize, str):
                raise ValueError(f"presize {presize!r} is not a string")
            original_sizes = _original_sizes(document.get("original_sizes", {}))
            index = cls(size, tuple(members), presize, original_sizes)
        except (ValueError, TypeError, KeyError, RecursionError) as exc:
            raise ShardError(
                f"unreadable shard index: {exc}",
                url=url,
                stage="index",
                cause=Reason.INDEX_MISMATCH,
            ) from exc
        index.check(url)
        return index

    def check(self, url: str) -> None:
        """Refuse (``ShardError``, ``IndexMismatch``, naming the member and its offset) an
        index that cannot describe a tar of :attr:`size` bytes: every member a sample
        member, its headers whole blocks before its data, its data inside the shard, and
        the members in tar order without overlapping (a member listed twice overlaps
        itself). What it says of the shard's headers is checked when a sample is read."""

        def refuse(member: Member, why: str) -> ShardError:
            return ShardError(
                f"the index lists member {member.name!r} at offset {member.header_offset} "
                f"(data {member.size} bytes at {member.offset}): {why}",
                url=url,
                stage="index",
                cause=Reason.INDEX_MISMATCH,
            )

        if not 0 <= self.size < MAX_SIZE:
            raise ShardError(
                f"the index gives an impossible shard size {self.size}",
                url=url,
                stage="index",
                cause=Reason.INDEX_MISMATCH,
            )
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
            raise ShardError(
                f"the index gives original sizes of members it does not list: {unlisted[:10]}",
                url=url,
                stage="index",
                cause=Reason.INDEX_MISMATCH,
            )


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _original_sizes(value: object) -> dict[str, tuple[int, int]]:
    """``{"name": [width, height]}`` read back; ValueError for anything else."""
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
