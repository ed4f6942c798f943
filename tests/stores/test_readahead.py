"""ReadaheadStore over the in-memory store: ranges served from spans read once, exact bytes
across span boundaries, one GET per span at a time, the memory bound, failures, and the
reads it leaves to the wrapped store."""

from __future__ import annotations

import asyncio
import itertools
import os
import random

import pytest

from concurrent_loader import FetchConfig, Readahead
from concurrent_loader.errors import ConfigError, Reason, ServerError
from concurrent_loader.stores.base import ByteRange
from concurrent_loader.stores.readahead import ReadaheadConfig, ReadaheadStore
from concurrent_loader.streaming.sampler import shuffle_within_window
from concurrent_loader.testing.memory import MemoryConfig, MemoryStore

SPAN = 1000
BLOB = os.urandom(10 * SPAN + 123)  # ten whole spans and a short last one


def config(memory: MemoryConfig, max_spans: int = 4) -> ReadaheadConfig:
    return ReadaheadConfig(
        memory, {"blob": len(BLOB)}, Readahead(span_bytes=SPAN, max_bytes=max_spans * SPAN)
    )


def read_all(store_config: ReadaheadConfig, ranges: list[ByteRange]) -> list[tuple[bytes, bool]]:
    """Each range read in turn through one store: (bytes, served without a request)."""

    async def run() -> list[tuple[bytes, bool]]:
        store = store_config.open(FetchConfig())
        try:
            out = []
            for r in ranges:
                body = await store.get("blob", r)
                out.append((bytes(body.data), not body.round_trip))
            return out
        finally:
            await store.close()

    return asyncio.run(run())


def test_ranges_in_order_cost_one_get_per_span_and_are_exact():
    memory = MemoryConfig({"blob": BLOB})
    ranges = [ByteRange(i, min(i + 97, len(BLOB))) for i in range(0, len(BLOB), 97)]
    got = read_all(config(memory), ranges)
    assert [data for data, _ in got] == [BLOB[r.start : r.end] for r in ranges]
    assert memory.stats.total == 11  # the spans, each once (ranges crossing two included)
    assert sum(hit for _, hit in got) == len(ranges) - 11


def test_a_range_across_a_span_boundary_is_put_together_from_both():
    memory = MemoryConfig({"blob": BLOB})
    r = ByteRange(SPAN - 10, SPAN + 10)
    assert read_all(config(memory), [r]) == [(BLOB[r.start : r.end], False)]
    assert memory.stats.total == 2


def test_the_last_span_stops_at_the_objects_end():
    memory = MemoryConfig({"blob": BLOB})
    r = ByteRange(len(BLOB) - 5, len(BLOB))
    assert read_all(config(memory), [r])[0][0] == BLOB[-5:]


@pytest.mark.parametrize(
    "byte_range",
    [None, ByteRange(0, SPAN + 1), ByteRange(len(BLOB) - 1, len(BLOB) + 1)],
    ids=["whole object", "longer than a span", "past the known size"],
)
def test_reads_it_does_not_take_go_to_the_store_as_they_are(byte_range):
    memory = MemoryConfig({"blob": BLOB})
    store_config = config(memory)

    async def run() -> None:
        store = store_config.open(FetchConfig())
        try:
            for _ in range(2):
                try:
                    body = await store.get("blob", byte_range)
                except Exception:  # past the end: the store's own error
                    continue
                assert body.round_trip
        finally:
            await store.close()

    asyncio.run(run())
    assert memory.stats.total == 2  # nothing kept: each read was a GET


def test_an_object_of_unknown_size_is_read_as_it_is():
    memory = MemoryConfig({"blob": BLOB, "other": BLOB})
    store_config = config(memory)

    async def run() -> None:
        store = store_config.open(FetchConfig())
        try:
            for _ in range(3):
                assert bytes((await store.get("other", ByteRange(0, 10))).data) == BLOB[:10]
        finally:
            await store.close()

    asyncio.run(run())
    assert memory.stats.gets["other"] == 3


def test_readers_of_one_span_share_its_get_and_a_cancelled_one_does_not_cancel_it():
    memory = MemoryConfig({"blob": BLOB}, latency_s=0.05)
    store_config = config(memory)

    async def run() -> list[bytes]:
        store = store_config.open(FetchConfig())
        try:
            loop = asyncio.get_running_loop()
            reads = [loop.create_task(store.get("blob", ByteRange(i, i + 10))) for i in (0, 20)]
            doomed = loop.create_task(store.get("blob", ByteRange(40, 50)))
            await asyncio.sleep(0.01)
            doomed.cancel()  # a hedge that lost, say
            return [bytes((await r).data) for r in reads]
        finally:
            await store.close()

    assert asyncio.run(run()) == [BLOB[0:10], BLOB[20:30]]
    assert memory.stats.total == 1


def test_kept_spans_stay_within_max_bytes_least_recently_read_dropped_first():
    memory = MemoryConfig({"blob": BLOB})
    store_config = config(memory, max_spans=2)
    r = [ByteRange(n * SPAN, n * SPAN + 1) for n in range(3)]
    got = read_all(store_config, [r[0], r[1], r[0], r[2], r[0], r[1]])
    # spans 0, 1 kept; 0 read again (hit); 2 drops 1; 0 still kept (hit); 1 fetched again
    assert [hit for _, hit in got] == [False, False, True, False, True, False]
    assert memory.stats.total == 4


def test_spans_in_flight_are_bounded_too_the_rest_read_as_they_are():
    memory = MemoryConfig({"blob": BLOB}, latency_s=0.02)
    store_config = config(memory, max_spans=2)

    async def run() -> list[bytes]:
        store = store_config.open(FetchConfig())
        assert isinstance(store, ReadaheadStore)
        try:
            reads = [store.get("blob", ByteRange(n * SPAN, n * SPAN + 5)) for n in range(5)]
            return [bytes(b.data) for b in await asyncio.gather(*reads)]
        finally:
            await store.close()

    assert asyncio.run(run()) == [BLOB[n * SPAN : n * SPAN + 5] for n in range(5)]
    ranges = memory.stats.gets["blob"]
    assert ranges == 5  # 2 spans, and 3 ranges read as they are


def test_a_failed_span_reaches_its_readers_and_is_fetched_again_next_time():
    def script(key: str, attempt: int) -> object:
        if attempt == 0:
            return ServerError("boom", url="memory://test/blob", cause=Reason.SERVER_ERROR)
        return None

    memory = MemoryConfig({"blob": BLOB}, script=script)
    store_config = config(memory)

    async def run() -> bytes:
        store = store_config.open(FetchConfig())
        try:
            with pytest.raises(ServerError):
                await store.get("blob", ByteRange(0, 10))
            return bytes((await store.get("blob", ByteRange(0, 10))).data)
        finally:
            await store.close()

    assert asyncio.run(run()) == BLOB[:10]
    assert memory.stats.total == 2


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"span_bytes": 0}, "span_bytes"),
        ({"max_bytes": True}, "max_bytes"),
        ({"span_bytes": 10, "max_bytes": 5}, "at least one span"),
    ],
)
def test_bad_settings_are_config_errors(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        Readahead(**kwargs)


@pytest.fixture
def fetched(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    """Every (start, end) the in-memory store is asked for, in order."""
    asked: list[tuple[int, int]] = []
    read = MemoryStore._read

    def recording(self, key, byte_range):
        asked.append((byte_range.start, byte_range.end))
        return read(self, key, byte_range)

    monkeypatch.setattr(MemoryStore, "_read", recording)
    return asked


def ranges_of(cuts: list[int]) -> tuple[list[int], list[int]]:
    """Consecutive ranges between ``cuts``, as a dataset would list them."""
    return cuts[:-1], cuts[1:]


def test_a_span_goes_once_every_range_known_in_it_was_read():
    memory = MemoryConfig({"blob": BLOB})
    cuts = [*range(0, len(BLOB), 250), len(BLOB)]
    store_config = ReadaheadConfig(
        memory,
        {"blob": len(BLOB)},
        Readahead(span_bytes=SPAN, max_bytes=4 * SPAN),
        {"blob": ranges_of(cuts)},
    )

    async def run() -> list[int]:
        store = store_config.open(FetchConfig())
        assert isinstance(store, ReadaheadStore)
        kept = []
        try:
            for start, end in itertools.pairwise(cuts):
                assert (
                    bytes((await store.get("blob", ByteRange(start, end))).data) == BLOB[start:end]
                )
                kept.append(store._kept_bytes)
            return kept
        finally:
            await store.close()

    kept = asyncio.run(run())
    assert memory.stats.total == 11  # each span once
    assert kept[3] == 0 and kept[-1] == 0  # span 0 went with its 4th range; the last too
    assert max(kept) <= SPAN


def test_a_window_wider_than_max_bytes_reads_the_overflow_as_it_is_and_no_span_twice(
    fetched,
):
    # Ranges read in an order that keeps many spans half read: all ten spans are started
    # before any is finished, with room for three. The overflow goes as single GETs, never
    # as a span fetched again.
    memory = MemoryConfig({"blob": BLOB})
    cuts = list(range(0, 10 * SPAN + 1, 500))  # two ranges per span
    store_config = ReadaheadConfig(
        memory,
        {"blob": len(BLOB)},
        Readahead(span_bytes=SPAN, max_bytes=3 * SPAN),
        {"blob": ranges_of(cuts)},
    )
    firsts = [ByteRange(c, c + 500) for c in cuts[:-1:2]]
    seconds = [ByteRange(c + 500, c + 1000) for c in cuts[:-1:2]]
    got = read_all(store_config, firsts + seconds)
    assert [data for data, _ in got] == [BLOB[r.start : r.end] for r in firsts + seconds]
    spans = [r for r in fetched if r[1] - r[0] == SPAN]
    singles = [r for r in fetched if r[1] - r[0] == 500]
    assert len(spans) == len(set(spans)) >= 3  # no span fetched twice
    assert len(spans) + len(singles) == len(fetched)
    assert sum(b - a for a, b in fetched) <= 10 * SPAN + 20 * 500


@pytest.mark.parametrize("window", [64, 512])
def test_a_shuffle_window_within_max_bytes_takes_one_get_per_span(window):
    # ShardDataset's rule: max_bytes = the shuffle buffer's bytes plus two spans. A span keeps
    # only its unread samples' bytes, so none is dropped, or fetched again, before all its
    # samples are read (whole spans kept until then overflowed: about half the samples were
    # read one GET each).
    size, span, count = 100, 3200, 32 * 40
    blob = os.urandom(count * size)
    cuts = list(range(0, count * size + 1, size))
    memory = MemoryConfig({"blob": blob})
    most = -(-window // 2) * size + 2 * span
    store_config = ReadaheadConfig(
        memory, {"blob": len(blob)}, Readahead(span, most), {"blob": ranges_of(cuts)}
    )
    order = list(shuffle_within_window(range(count), window, random.Random(window)))

    async def run() -> int:
        store = store_config.open(FetchConfig())
        assert isinstance(store, ReadaheadStore)
        peak = 0
        try:
            for i in order:
                body = await store.get("blob", ByteRange(i * size, (i + 1) * size))
                assert bytes(body.data) == blob[i * size : (i + 1) * size]
                peak = max(peak, store._kept_bytes + store._fetching_bytes)
            return peak
        finally:
            await store.close()

    assert asyncio.run(run()) <= most
    assert memory.stats.total == count * size // span  # one GET per span


def test_overlapping_declared_ranges_count_whole_and_stay_within_max_bytes():
    # A shard's sample ranges overlap (each runs into the next sample's headers): their
    # pieces take more than the span, and room is reserved for that much.
    memory = MemoryConfig({"blob": BLOB})
    starts, ends = [0, 100, 200, 1500], [900, 950, 1000, 2000]
    store_config = ReadaheadConfig(
        memory,
        {"blob": len(BLOB)},
        Readahead(span_bytes=SPAN, max_bytes=SPAN),
        {"blob": (starts, ends)},
    )

    async def run() -> int:
        store = store_config.open(FetchConfig())
        assert isinstance(store, ReadaheadStore)
        peak = 0
        try:
            for a, b in zip(starts, ends, strict=True):
                assert bytes((await store.get("blob", ByteRange(a, b))).data) == BLOB[a:b]
                peak = max(peak, store._kept_bytes + store._fetching_bytes)
            return peak
        finally:
            await store.close()

    assert asyncio.run(run()) <= SPAN


def test_parts_of_a_declared_range_are_served_from_its_piece():
    memory = MemoryConfig({"blob": BLOB})
    store_config = ReadaheadConfig(
        memory,
        {"blob": len(BLOB)},
        Readahead(span_bytes=SPAN, max_bytes=4 * SPAN),
        {"blob": ([0, 400], [400, 1000])},
    )
    parts = [ByteRange(400, 600), ByteRange(600, 800), ByteRange(800, 1000)]
    got = read_all(store_config, parts)
    assert [data for data, _ in got] == [BLOB[r.start : r.end] for r in parts]
    assert memory.stats.total == 1  # the span, once


def test_a_stragglers_hedge_reads_it_alone_not_the_span_again(fetched):
    memory = MemoryConfig({"blob": BLOB})
    cuts = list(range(0, 3 * SPAN + 1, 500))
    store_config = ReadaheadConfig(
        memory,
        {"blob": len(BLOB)},
        Readahead(span_bytes=SPAN, max_bytes=SPAN),
        {"blob": ranges_of(cuts)},
    )
    first, straggler = ByteRange(0, 500), ByteRange(500, 1000)
    later = [ByteRange(c, c + 500) for c in cuts[2:-1]]
    # span 0 half read, then dropped as stale once later spans need its room; its straggler
    # and a hedge of it, read right after, go alone
    got = read_all(store_config, [first, *later, straggler, straggler])
    assert [data for data, _ in got][-2:] == [BLOB[500:1000]] * 2
    assert fetched.count((0, SPAN)) == 1  # span 0 never fetched again
    assert fetched[-2:] == [(500, 1000)] * 2
