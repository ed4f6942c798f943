"""Coalescing a batch's ranged reads: table tests of the pure planning functions."""

from __future__ import annotations

import pytest

from concurrent_loader.sources import Read
from concurrent_loader.sources.coalesce import Coalescing, coalesce_ranges, plan_reads
from concurrent_loader.stores.base import ByteRange


def spans(*pairs: tuple[int, int]) -> list[ByteRange]:
    return [ByteRange(a, b) for a, b in pairs]


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
