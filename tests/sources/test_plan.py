"""How a batch's reads become GETs: table tests of the pure planning functions."""

from __future__ import annotations

import pytest

from concurrent_loader.fetch.parts import PartsConfig
from concurrent_loader.sources import Read
from concurrent_loader.sources.coalesce import (
    Coalescing,
    Get,
    Part,
    Shared,
    Whole,
    plan_fetches,
    plan_reads,
)
from concurrent_loader.stores.base import ByteRange, Capabilities


def spans(*pairs: tuple[int, int]) -> list[ByteRange]:
    return [ByteRange(a, b) for a, b in pairs]


def coalesce_ranges(ranges: list[ByteRange], coalescing: Coalescing) -> list[ByteRange]:
    """The merged ranges ``plan_reads`` reads for ``ranges`` of one object, by start."""
    plan = plan_reads([(i, Read("k", r)) for i, r in enumerate(ranges)], coalescing)
    merged = [m.read.byte_range for m in plan if m.read.byte_range is not None]
    return sorted(merged, key=lambda r: (r.start, r.end))


@pytest.mark.parametrize(
    "ranges,gap,max_bytes,expected",
    [
        # far apart: two GETs
        ([(0, 10), (100, 110)], 50, 1000, [(0, 10), (100, 110)]),
        # the gap is exactly the threshold: one GET
        ([(0, 10), (60, 70)], 50, 1000, [(0, 70)]),
        # one byte over the threshold: two
        ([(0, 10), (61, 70)], 50, 1000, [(0, 10), (61, 70)]),
        # adjacent and overlapping always join, even with no gap allowed
        ([(0, 10), (10, 20), (15, 30)], 0, 1000, [(0, 30)]),
        # unsorted input, a range inside another
        ([(100, 200), (0, 50), (120, 130)], 10, 1000, [(0, 50), (100, 200)]),
        # the merged read stops growing at max_bytes
        ([(0, 40), (50, 90), (100, 140)], 20, 100, [(0, 90), (100, 140)]),
        # one read alone larger than max_bytes stays whole
        ([(0, 500)], 20, 100, [(0, 500)]),
        ([], 10, 100, []),
    ],
)
def test_coalesce_ranges(ranges, gap, max_bytes, expected):
    coalescing = Coalescing(max_gap=gap, max_bytes=max_bytes)
    assert coalesce_ranges(spans(*ranges), coalescing) == spans(*expected)


def test_disabled_coalescing_merges_nothing():
    coalescing = Coalescing(enabled=False)
    ranges = spans((0, 10), (10, 20), (15, 25))
    assert coalesce_ranges(ranges, coalescing) == ranges
    reads = [(i, Read("k", r)) for i, r in enumerate(ranges)]
    plan = plan_reads(reads, coalescing)
    assert [(m.read.byte_range, [p.tag for p in m.parts]) for m in plan] == [
        (r, [i]) for i, r in enumerate(ranges)
    ]


@pytest.mark.parametrize("bad", [{"max_gap": -1}, {"max_bytes": 0}])
def test_bad_settings_are_refused(bad):
    with pytest.raises(ValueError):
        Coalescing(**bad)


def test_plan_serves_every_read_exactly_once_with_its_own_bytes():
    body = {"a": bytes(range(256)) * 4, "b": bytes(reversed(range(256))) * 4}
    reads = [
        ("r0", Read("a", ByteRange(500, 600))),
        ("r1", Read("b", ByteRange(0, 10))),
        ("r2", Read("a", ByteRange(10, 20))),
        ("r3", Read("a", ByteRange(15, 40))),  # overlaps r2
        ("r4", Read("a")),  # a whole object is never merged
        ("r5", Read("a", ByteRange(900, 1000))),
        ("r6", Read("a", ByteRange(10, 20))),  # the same range twice (sampling with replacement)
    ]
    plan = plan_reads(reads, Coalescing(max_gap=100, max_bytes=10_000))
    served = {}
    for merged in plan:
        data = body[merged.read.key]
        if merged.read.byte_range is not None:
            r = merged.read.byte_range
            assert merged.read.size == r.length
            data = data[r.start : r.end]
        for part in merged.parts:
            assert part.tag not in served
            served[part.tag] = part.of(data)
    for tag, read in reads:
        r = read.byte_range
        want = body[read.key] if r is None else body[read.key][r.start : r.end]
        assert served[tag] == want, tag
    # "a": [10, 40) with r2, r3, r6; [500, 600); [900, 1000) is 300 bytes away: alone.
    ranged_a = sorted(
        (m.read.byte_range.start, m.read.byte_range.end)
        for m in plan
        if m.read.key == "a" and m.read.byte_range is not None
    )
    assert ranged_a == [(10, 40), (500, 600), (900, 1000)]
    assert len(plan) == 5
    # GETs start in the order of the first read each serves
    assert [m.parts[0].tag for m in plan][:2] == ["r0", "r1"]


def test_overlapping_reads_do_not_grow_a_merged_read_past_max_bytes():
    coalescing = Coalescing(max_gap=0, max_bytes=100)
    ranges = spans((0, 60), (50, 110), (100, 160))
    assert coalesce_ranges(ranges, coalescing) == spans((0, 60), (50, 110), (100, 160))


RANGES = Capabilities(remote=True, listing=True, ranges=True)
NO_RANGES = Capabilities(remote=True, listing=False, ranges=False)
CACHE = Capabilities(remote=True, listing=True, ranges=True, whole_reads_up_to=1000)
PARTS = PartsConfig(part_size=100, parts_in_flight=2)  # reserves size + 2 parts in flight
MERGE = Coalescing(max_gap=10, max_bytes=1000)


def whole(key: str, size: int | None = None) -> Read:
    return Read(key, size=size)


def ranged(key: str, start: int, end: int) -> Read:
    return Read(key, ByteRange(start, end), end - start)


@pytest.mark.parametrize(
    "samples,capabilities,parts,coalescing,budget,plan",
    [
        pytest.param(
            [(0, [whole("a", 50)])],
            RANGES,
            PARTS,
            None,
            10_000,
            [Whole(0, (Get(whole("a", 50), None, 50),))],
            id="a small object: one GET reserving its size",
        ),
        pytest.param(
            [(0, [whole("a")])],
            RANGES,
            PARTS,
            None,
            10_000,
            [Whole(0, (Get(whole("a")),))],
            id="size unknown: one GET, the budget estimates",
        ),
        pytest.param(
            [(0, [whole("a", 250)])],
            RANGES,
            PARTS,
            None,
            10_000,
            [Whole(0, (Get(whole("a", 250), 250, 450),))],
            id="a large object: in parts, reserving the parts in flight too",
        ),
        pytest.param(
            [(0, [whole("a", 250)])],
            NO_RANGES,
            PARTS,
            None,
            10_000,
            [Whole(0, (Get(whole("a", 250), None, 250),))],
            id="a store without ranges: one GET",
        ),
        pytest.param(
            [(0, [whole("a", 250)])],
            RANGES,
            PartsConfig(enabled=False),
            None,
            10_000,
            [Whole(0, (Get(whole("a", 250), None, 250),))],
            id="parts disabled: one GET",
        ),
        pytest.param(
            [(0, [whole("a", 250)])],
            CACHE,
            PARTS,
            None,
            10_000,
            [Whole(0, (Get(whole("a", 250), None, 250),))],
            id="a whole object a cache wants in one read: one GET",
        ),
        pytest.param(
            [(0, [ranged("a", 0, 250)])],
            CACHE,
            PARTS,
            None,
            10_000,
            [Whole(0, (Get(ranged("a", 0, 250), 250, 450),))],
            id="a large span still goes in parts under a cache",
        ),
        pytest.param(
            [(0, [whole("a", 5), whole("b", 6)]), (1, [whole("c", 7)])],
            RANGES,
            PARTS,
            None,
            10_000,
            [
                Whole(0, (Get(whole("a", 5), None, 5), Get(whole("b", 6), None, 6))),
                Whole(1, (Get(whole("c", 7), None, 7),)),
            ],
            id="without coalescing: one fetch per sample, in order, all its reads",
        ),
        pytest.param(
            [(0, [ranged("s", 0, 10)]), (1, [ranged("s", 15, 30)]), (2, [ranged("t", 0, 5)])],
            RANGES,
            PARTS,
            MERGE,
            10_000,
            [
                Shared(Get(ranged("s", 0, 30), None, 30), (Part(0, 0, 10), Part(1, 15, 30))),
                Shared(Get(ranged("t", 0, 5), None, 5), (Part(2, 0, 5),)),
            ],
            id="spans of one shard merge; each sample's bytes are sliced back out",
        ),
        pytest.param(
            [(0, [ranged("s", 0, 10)]), (1, [ranged("s", 15, 30)])],
            RANGES,
            PARTS,
            MERGE,
            20,
            [
                Shared(Get(ranged("s", 0, 10), None, 10), (Part(0, 0, 10),)),
                Shared(Get(ranged("s", 15, 30), None, 15), (Part(1, 0, 15),)),
            ],
            id="a merged read stays within the byte budget",
        ),
        pytest.param(
            [(0, [ranged("s", 0, 150)]), (1, [ranged("s", 150, 260)])],
            RANGES,
            PARTS,
            MERGE,
            10_000,
            [
                Shared(Get(ranged("s", 0, 260), 260, 460), (Part(0, 0, 150), Part(1, 150, 260))),
            ],
            id="a large merged read goes in parts",
        ),
        pytest.param(
            [(0, [ranged("s", 0, 10)]), (1, [ranged("s", 10, 20), whole("x", 3)])],
            RANGES,
            PARTS,
            MERGE,
            10_000,
            [
                Whole(1, (Get(ranged("s", 10, 20), None, 10), Get(whole("x", 3), None, 3))),
                Shared(Get(ranged("s", 0, 10), None, 10), (Part(0, 0, 10),)),
            ],
            id="a sample of several reads is not merged, and comes first",
        ),
        pytest.param(
            [(0, [whole("a", 5)]), (1, [whole("a", 5)])],
            RANGES,
            PARTS,
            MERGE,
            10_000,
            [
                Shared(Get(whole("a", 5), None, 5), (Part(0, 0, None),)),
                Shared(Get(whole("a", 5), None, 5), (Part(1, 0, None),)),
            ],
            id="whole objects never merge",
        ),
        pytest.param([], RANGES, PARTS, MERGE, 10_000, [], id="an empty batch: nothing"),
    ],
)
def test_plan_fetches(samples, capabilities, parts, coalescing, budget, plan):
    assert plan_fetches(samples, capabilities, parts, coalescing, budget) == plan
