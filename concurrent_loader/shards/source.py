"""Samples of tar shards: sample ``i`` is one ranged read of its shard, checked header by header.

Index ``i`` runs over the samples shard by shard, in tar order. A sample's span runs from
where the previous sample ends through the next sample's first headers
(:meth:`ShardSource._span`), so a shard's spans cover it. A span that is not exactly the
members the index lists is ``IndexMismatch``, a member of the sample the index leaves out
``MissingMember``, a sample past the shard's listed size ``TruncatedShard`` (before any
GET); each names shard, member and offset. When the samples before it read without
error, a sample is exactly the one ``webdataset`` reads there (``__key__``, ``__url__``,
extension: bytes); a hostile index can only make samples fail.
"""

from __future__ import annotations

import bisect
import functools
import itertools
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..config import FetchConfig
from ..errors import LoaderError, Reason, ShardError
from ..keys import KeyTable
from ..sources.base import Read
from ..sources.objects import call_decode
from ..stores.base import ByteRange, StoreConfig
from .index import ShardIndex
from .tar import Member, TarWalk, group_samples, is_sample_member, padded, split_name

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
    ) -> None:
        self.store = store
        self.fetch_config = fetch_config
        self.decode_sample = decode
        self.shards = list(shards)
        self.listed_sizes = list(listed_sizes)
        self.shard_lengths: list[int] = []
        self._index_sizes = [index.size for index in indexes]
        for key, index, listed in zip(shards, indexes, listed_sizes, strict=True):
            if listed is not None and listed > index.size:
                raise ShardError(
                    f"the shard is {listed} bytes, its index ({key}.idx) was written for "
                    f"{index.size}: the shard was re-packed or written again after its index; "
                    "pack it again, or remove the index to have the shard scanned",
                    url=store.url_for(key),
                    stage="index",
                    cause=Reason.INDEX_MISMATCH,
                )
        keys: list[str] = []
        members: list[Member] = []
        first_member: list[int] = []
        for key, index in zip(shards, indexes, strict=True):
            samples = group_samples(list(index.members), store.url_for(key))
            self.shard_lengths.append(len(samples))
            for sample_key, parts in samples:
                keys.append(sample_key)
                first_member.append(len(members))
                members.extend(member for _, member in parts)
        first_member.append(len(members))
        # Compact and fork-friendly, as an ObjectDataset's keys (one blob, no str objects).
        self.sample_keys: Sequence[str] = KeyTable(keys)
        self._names = KeyTable([m.name for m in members])
        numbers = [(m.header_offset, m.offset, m.size) for m in members]
        columns = np.array(numbers, dtype=np.int64).reshape(-1, 3).T.copy()
        self._header_offsets, self._offsets, self._sizes = columns
        self._first_member = np.asarray(first_member, dtype=np.int64)
        # a list: bisect on it costs a fraction of numpy's searchsorted on a scalar, per sample
        self._shard_starts = list(itertools.accumulate(self.shard_lengths, initial=0))

    def __len__(self) -> int:
        return len(self.sample_keys)

    def shard_of(self, index: int) -> int:
        return bisect.bisect_right(self._shard_starts, index) - 1

    def _members(self, index: int) -> range:
        return range(int(self._first_member[index]), int(self._first_member[index + 1]))

    def _last_of_shard(self, index: int) -> bool:
        return index + 1 == self._shard_starts[self.shard_of(index) + 1]

    def _span(self, index: int) -> ByteRange:
        """What is read of sample ``index``: from the previous sample's end (the shard's start)
        through the next sample's first headers (the shard's end), so walking it sees every
        member the sample could be missing."""
        shard = self.shard_of(index)
        if index == self._shard_starts[shard]:
            start = 0
        else:
            last = self._members(index - 1)[-1]
            start = padded(int(self._offsets[last] + self._sizes[last]))
        if self._last_of_shard(index):
            return ByteRange(start, self._index_sizes[shard])
        return ByteRange(start, int(self._offsets[self._members(index + 1)[0]]))

    def sample_ranges(self, shard: int) -> tuple[np.ndarray, np.ndarray]:
        first = self._shard_starts[shard]
        spans = [self._span(i) for i in range(first, first + self.shard_lengths[shard])]
        bounds = np.array([(s.start, s.end) for s in spans], dtype=np.int64).reshape(-1, 2)
        return bounds[:, 0].copy(), bounds[:, 1].copy()

    def url_for(self, index: int) -> str:
        return self.store.url_for(self.shards[self.shard_of(index)])

    def where(self, index: int, member: int | None = None) -> str:
        """Sample ``index`` (or one of its members) in words: key, member name, offset."""
        j = self._members(index)[0] if member is None else member
        return (
            f"sample {self.sample_keys[index]!r}, member {self._names[j]!r} at offset "
            f"{int(self._header_offsets[j])}"
        )

    def _error(
        self, index: int, message: str, cause: Reason, j: int | None = None, stage: str = "decode"
    ) -> ShardError:
        message = f"{self.where(index, j)}: {message}"
        return ShardError(message, url=self.url_for(index), stage=stage, cause=cause)

    # ------------------------------------------------------------------ SampleSource

    def reads(self, index: int) -> Sequence[Read]:
        span = self._span(index)
        shard = self.shard_of(index)
        listed = self.listed_sizes[shard]
        limit = self._index_sizes[shard] if listed is None else listed
        if span.end > limit:
            member = next(
                (j for j in self._members(index) if self._offsets[j] + self._sizes[j] > limit),
                self._members(index)[0],
            )
            raise self._error(
                index,
                f"its {int(self._sizes[member])} bytes end past the shard's end ({limit} bytes; "
                f"the sample and the headers after it end at {span.end}): the shard is truncated",
                Reason.TRUNCATED_SHARD,
                member,
                stage="fetch",
            )
        return (Read(self.shards[shard], span, span.length),)

    def decode(self, index: int, bodies: Sequence[bytes | bytearray]) -> Any:
        sample = self.sample(index, bodies[0])
        if self.decode_sample is None:
            return sample
        where = functools.partial(self.where, index)  # worded only for an error
        return call_decode(self.decode_sample, sample, sample["__url__"], where)

    def sample(self, index: int, body: bytes | bytearray) -> dict[str, Any]:
        """Sample ``index`` from the bytes of its span, after checking them against the index."""
        span = self._span(index)
        url = self.url_for(index)
        if len(body) != span.length:
            message = f"got {len(body)} of the sample's {span.length} bytes"
            raise self._error(index, message, Reason.TRUNCATED_SHARD)
        view = memoryview(body)
        last = self._last_of_shard(index)
        listed = self._listed(index, last)

        def read(offset: int, length: int) -> memoryview:
            if offset + length > span.end and not last:
                # The span ends where the index puts the next sample's first data: headers
                # running past it show the index wrong, not the shard cut.
                raise ShardError(
                    f"the shard's headers run past offset {span.end} (bytes {offset} to "
                    f"{offset + length}), where the index puts the data of "
                    f"{self._names[self._members(index + 1)[0]]!r}: the index does not "
                    "match the shard",
                    url=url,
                    stage="decode",
                    cause=Reason.INDEX_MISMATCH,
                )
            return view[offset - span.start : offset - span.start + length]

        walk = TarWalk(read, span.start, span.end, url)
        try:
            found = list(walk)
        except ShardError as exc:
            raise exc.for_object(url, self.where(index)) from exc
        key = self.sample_keys[index]
        own = len(self._members(index))
        self._check(index, key, found, walk, listed, own)
        sample: dict[str, Any] = {"__key__": key, "__url__": url}
        for member in listed[:own]:
            split = split_name(member.name)
            assert split is not None  # indexed members are sample members
            start = member.offset - span.start
            sample[split[1]] = bytes(view[start : start + member.size])
        return sample

    def _listed(self, index: int, last: bool) -> list[Member]:
        """The members the index lists for sample ``index``, then (unless ``last`` of its
        shard) the next sample's first: those a walk of its span must find."""
        first = int(self._first_member[index])
        stop = int(self._first_member[index + 1]) + (not last)
        names = [self._names[j] for j in range(first, stop)]
        columns = (self._header_offsets, self._offsets, self._sizes)
        numbers = zip(*(column[first:stop].tolist() for column in columns), strict=True)
        return [Member(name, *row) for name, row in zip(names, numbers, strict=True)]

    def _check(
        self,
        index: int,
        key: str,
        found: list[Member],
        walk: TarWalk,
        expected: list[Member],
        own: int,
    ) -> None:
        """The sample members walked in the span are exactly those the index lists (the
        ``own`` first of ``expected``), then the next sample's first member (or the
        archive's end); a member the index leaves out that webdataset would group into
        this sample (``key``) is ``MissingMember``."""
        last = len(expected) == own
        first_member = int(self._first_member[index])  # expected[i] is member first_member + i
        error = functools.partial(self._error, index)
        first = index == self._shard_starts[self.shard_of(index)]
        matched = 0
        for member in found:
            if matched < len(expected) and member == expected[matched]:
                matched += 1  # a listed member: a sample member
                continue
            if not is_sample_member(member.name):
                continue
            said = expected[matched] if matched < len(expected) else None
            if said is not None and member.header_offset >= said.header_offset:
                raise error(
                    f"the index says {said.name!r} ({said.size} bytes at {said.offset}, "
                    f"headers at {said.header_offset}), the shard has {member.name!r} "
                    f"({member.size} bytes at {member.offset}, headers at "
                    f"{member.header_offset})",
                    Reason.INDEX_MISMATCH,
                    first_member + matched,
                )
            # A sample member the index leaves out. Grouped as webdataset groups, it is
            # this sample's when it comes between its members, has its key, or (before its
            # members) is not the previous sample's; after the shard's last sample, no
            # other walk sees it. The neighbour's walk judges the rest.
            other = split_name(member.name)
            assert other is not None
            if matched == 0:
                previous_key = None if first else self.sample_keys[index - 1]
                ours = other[0] == key or other[0] != previous_key
            else:
                ours = matched < own or other[0] == key or last
            if ours:
                raise error(
                    f"member {member.name!r} at offset {member.header_offset} is in the shard "
                    "but not in its index",
                    Reason.MISSING_MEMBER,
                )
        if matched < len(expected):
            said = expected[matched]
            where = "the archive ends" if walk.at_eof else f"the headers end at {walk.offset}"
            raise error(
                f"{said.name!r} at offset {said.header_offset} is not in the shard ({where} "
                "before it): the index does not match the shard",
                Reason.INDEX_MISMATCH,
                first_member + matched,
            )
        if last and not walk.at_eof and walk.offset != walk.end:
            raise error(
                f"the members run to {walk.offset}, past the shard's end ({walk.end})",
                Reason.TRUNCATED_SHARD,
            )

    # ------------------------------------------------------------------ NamingSource

    def read_failed(self, index: int, exc: BaseException) -> BaseException:
        if not isinstance(exc, LoaderError):
            return exc
        named = exc.for_object(self.url_for(index), self.where(index))
        named.__cause__ = exc
        return named

    def __repr__(self) -> str:
        return f"ShardSource({self.store}, {len(self.shards)} shards, {len(self)} samples)"
