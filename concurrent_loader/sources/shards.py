"""Samples of tar shards: sample ``i`` is one ranged read of its shard, checked header by header.

Global index ``i`` enumerates samples shard by shard in the order of ``shards`` (shard 0's
samples first, in tar order): ``shard_lengths[s]`` samples in shard ``s``. A sample is read
as one byte range, from its first member's first header to its last member's last byte, so
the headers between its members come with it: :meth:`ShardSource.decode` walks them and
refuses (:class:`~concurrent_loader.errors.ShardError`, naming shard, member and offset) a
sample whose bytes are not the members its index lists. A sample that ends past the
shard's listed size is refused before any GET (``TruncatedShard``).

Samples are dicts as ``webdataset`` makes them: ``{"__key__": key, "__url__": shard URL,
extension: bytes, ...}``, passed to ``decode`` when one is given. The source merges a
batch's reads of one shard (:attr:`coalescing`, see :mod:`.coalesce`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..config import FetchConfig
from ..errors import DecodeError, LoaderError, Reason, ShardError
from ..keys import KeyTable
from ..shards.index import ShardIndex
from ..shards.tar import (
    BLOCK,
    Member,
    group_samples,
    is_sample_member,
    padded,
    read_members,
    split_name,
)
from ..stores.base import ByteRange, StoreConfig
from .base import Read
from .coalesce import Coalescing

__all__ = ["ShardSource"]

SampleDecoder = Callable[[dict[str, Any]], Any]


class ShardSource:
    """The samples of ``shards`` (keys of ``store``) as their ``indexes`` list them;
    ``listed_sizes[s]`` is shard ``s``'s size from a listing (None when unknown)."""

    def __init__(
        self,
        store: StoreConfig,
        shards: Sequence[str],
        indexes: Sequence[ShardIndex],
        listed_sizes: Sequence[int | None],
        fetch_config: FetchConfig,
        decode: SampleDecoder | None = None,
        coalescing: Coalescing | None = None,
    ) -> None:
        if not len(shards) == len(indexes) == len(listed_sizes):
            raise ValueError(
                f"{len(shards)} shards, {len(indexes)} indexes, {len(listed_sizes)} sizes"
            )
        self.store = store
        self.fetch_config = fetch_config
        self.coalescing = coalescing or Coalescing()
        self.decode_sample = decode
        self.shards = list(shards)
        self.listed_sizes = list(listed_sizes)
        self.shard_lengths: list[int] = []
        self._index_sizes = [index.size for index in indexes]
        keys: list[str] = []
        names: list[str] = []
        header_offsets: list[int] = []
        offsets: list[int] = []
        sizes: list[int] = []
        first_member: list[int] = []
        for key, index in zip(shards, indexes, strict=True):
            samples = group_samples(list(index.members), store.url_for(key))
            self.shard_lengths.append(len(samples))
            for sample_key, parts in samples:
                keys.append(sample_key)
                first_member.append(len(names))
                for _, member in parts:
                    names.append(member.name)
                    header_offsets.append(member.header_offset)
                    offsets.append(member.offset)
                    sizes.append(member.size)
        first_member.append(len(names))
        # Compact and fork-friendly, as an ObjectDataset's keys (one blob, no str objects).
        self.sample_keys: Sequence[str] = KeyTable(keys)
        self._names = KeyTable(names)
        self._header_offsets = np.asarray(header_offsets, dtype=np.int64)
        self._offsets = np.asarray(offsets, dtype=np.int64)
        self._sizes = np.asarray(sizes, dtype=np.int64)
        self._first_member = np.asarray(first_member, dtype=np.int64)
        self._shard_starts = np.cumsum([0, *self.shard_lengths], dtype=np.int64)

    def __len__(self) -> int:
        return len(self.sample_keys)

    def shard_of(self, index: int) -> int:
        """The number of the shard holding sample ``index``."""
        return int(np.searchsorted(self._shard_starts, index, side="right")) - 1

    def _members(self, index: int) -> range:
        return range(int(self._first_member[index]), int(self._first_member[index + 1]))

    def _end(self, index: int) -> int:
        """The end of the sample's last member's data."""
        last = self._members(index)[-1]
        return int(self._offsets[last] + self._sizes[last])

    def _span(self, index: int) -> ByteRange:
        """What is read of sample ``index``: from its first header to the header block that
        follows its last member (when the shard has one), so that a member of the sample
        left out of the index, between or right after its members, is seen."""
        members = self._members(index)
        end = padded(self._end(index)) + BLOCK
        shard = self.shard_of(index)
        listed = self.listed_sizes[shard]
        limit = (
            self._index_sizes[shard] if listed is None else min(listed, self._index_sizes[shard])
        )
        return ByteRange(
            int(self._header_offsets[members[0]]), max(self._end(index), min(end, limit))
        )

    def sample_ranges(self, shard: int) -> tuple[np.ndarray, np.ndarray]:
        """The byte ranges :meth:`reads` asks of shard ``shard``, one per sample in tar order:
        (starts, ends), both ascending (neighbours overlap by at most a header block)."""
        first = int(self._shard_starts[shard])
        spans = [self._span(i) for i in range(first, first + self.shard_lengths[shard])]
        starts = np.fromiter((s.start for s in spans), dtype=np.int64, count=len(spans))
        ends = np.fromiter((s.end for s in spans), dtype=np.int64, count=len(spans))
        return starts, ends

    def url_for(self, index: int) -> str:
        return self.store.url_for(self.shards[self.shard_of(index)])

    def where(self, index: int, member: int | None = None) -> str:
        """Sample ``index`` (or one of its members) in words: key, member name, offset."""
        j = self._members(index)[0] if member is None else member
        return (
            f"sample {self.sample_keys[index]!r}, member {self._names[j]!r} at offset "
            f"{int(self._header_offsets[j])}"
        )

    # ------------------------------------------------------------------ SampleSource

    def reads(self, index: int) -> Sequence[Read]:
        span = self._span(index)
        listed = self.listed_sizes[self.shard_of(index)]
        if listed is not None and self._end(index) > listed:
            member = next(
                j for j in self._members(index) if self._offsets[j] + self._sizes[j] > listed
            )
            raise ShardError(
                f"{self.where(index, member)} ({int(self._sizes[member])} bytes) ends past the "
                f"shard's end ({listed} bytes): the shard is truncated",
                url=self.url_for(index),
                stage="fetch",
                cause=Reason.TRUNCATED_SHARD,
            )
        return (Read(self.shards[self.shard_of(index)], span, span.length),)

    def decode(self, index: int, bodies: Sequence[bytes | bytearray]) -> Any:
        sample = self.sample(index, bodies[0])
        if self.decode_sample is None:
            return sample
        try:
            return self.decode_sample(sample)
        except LoaderError as exc:
            if exc.url is not None:
                raise
            raise self._about(index, exc) from exc.__cause__
        except Exception as exc:
            raise DecodeError(
                f"{self.where(index)}: decode raised {type(exc).__name__}: {exc}",
                url=self.url_for(index),
                stage="decode",
                cause=Reason.UNDECODABLE,
            ) from exc

    def sample(self, index: int, body: bytes | bytearray) -> dict[str, Any]:
        """Sample ``index`` from the bytes of its span, after checking them against the index."""
        span = self._span(index)
        url = self.url_for(index)
        if len(body) != span.length:
            raise ShardError(
                f"{self.where(index)}: got {len(body)} of the sample's {span.length} bytes",
                url=url,
                stage="decode",
                cause=Reason.TRUNCATED_SHARD,
            )
        view = memoryview(body)
        members = self._members(index)

        def read(offset: int, length: int) -> memoryview:
            return view[offset - span.start : offset - span.start + length]

        try:
            found = list(read_members(read, span.start, span.end, url))
        except ShardError as exc:
            raise self._about(index, exc) from exc
        self._check(index, found)
        sample: dict[str, Any] = {"__key__": self.sample_keys[index], "__url__": url}
        for j in members:
            split = split_name(self._names[j])
            assert split is not None  # indexed members are sample members
            start = int(self._offsets[j]) - span.start
            sample[split[1]] = bytes(view[start : start + int(self._sizes[j])])
        return sample

    def _check(self, index: int, found: list[Member]) -> None:
        """The members walked in the sample's span are exactly those its index lists; the
        span's last header, after the sample, may only start another sample."""
        url = self.url_for(index)
        key = self.sample_keys[index]
        members = self._members(index)
        expected = {
            (self._names[j], int(self._offsets[j]), int(self._sizes[j])): j for j in members
        }
        last_end = self._end(index)
        seen = set()
        for member in found:
            if not is_sample_member(member.name):
                continue
            place = (member.name, member.offset, member.size)
            if place in expected:
                seen.add(place)
                continue
            split = split_name(member.name)
            if split is not None and split[0] == key:
                raise ShardError(
                    f"sample {key!r}: member {member.name!r} at offset {member.header_offset} "
                    "is in the shard but not in its index",
                    url=url,
                    stage="decode",
                    cause=Reason.MISSING_MEMBER,
                )
            if member.header_offset >= last_end:
                break  # the next sample
            j = next(j for place, j in expected.items() if place not in seen)
            raise ShardError(
                f"{self.where(index, j)}: the index says {self._names[j]!r} "
                f"({int(self._sizes[j])} bytes at {int(self._offsets[j])}), the shard has "
                f"{member.name!r} ({member.size} bytes at {member.offset})",
                url=url,
                stage="decode",
                cause=Reason.INDEX_MISMATCH,
            )
        for place, j in expected.items():
            if place not in seen:
                raise ShardError(
                    f"{self.where(index, j)}: not in the shard (the index does not match it)",
                    url=url,
                    stage="decode",
                    cause=Reason.INDEX_MISMATCH,
                )

    # ------------------------------------------------------------------ CoalescingSource

    def read_failed(self, index: int, exc: BaseException) -> BaseException:
        return self._about(index, exc) if isinstance(exc, LoaderError) else exc

    def _about(self, index: int, exc: LoaderError) -> LoaderError:
        """``exc`` again, of the same type, naming the shard, the sample's member and offset."""
        named = type(exc)(
            f"{self.where(index)}: {exc.message}" if exc.message else self.where(index),
            url=self.url_for(index),
            stage=exc.stage,
            cause=exc.cause,
            status=exc.status,
            code=exc.code,
        )
        named.__cause__ = exc
        return named

    def __repr__(self) -> str:
        return f"ShardSource({self.store}, {len(self.shards)} shards, {len(self)} samples)"
