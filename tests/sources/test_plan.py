"""How a batch's reads become GETs: a table test of the pure planning function."""

from __future__ import annotations

import pytest

from concurrent_loader.fetch.parts import PartsConfig
from concurrent_loader.sources import Read
from concurrent_loader.sources.base import Get, Whole, plan_fetches
from concurrent_loader.stores.base import ByteRange, Capabilities

RANGES = Capabilities(remote=True, listing=True, ranges=True)
NO_RANGES = Capabilities(remote=True, listing=False, ranges=False)
CACHE = Capabilities(remote=True, listing=True, ranges=True, whole_reads_up_to=1000)
PARTS = PartsConfig(part_size=100, parts_in_flight=2)  # reserves size + 2 parts in flight


def whole(key: str, size: int | None = None) -> Read:
    return Read(key, size=size)


def ranged(key: str, start: int, end: int) -> Read:
    return Read(key, ByteRange(start, end), end - start)


@pytest.mark.parametrize(
    "samples,capabilities,parts,plan",
    [
        pytest.param(
            [(0, [whole("a", 50)])],
            RANGES,
            PARTS,
            [Whole(0, (Get(whole("a", 50), None, 50),))],
            id="a small object: one GET reserving its size",
        ),
        pytest.param(
            [(0, [whole("a")])],
            RANGES,
            PARTS,
            [Whole(0, (Get(whole("a")),))],
            id="size unknown: one GET, the budget estimates",
        ),
        pytest.param(
            [(0, [whole("a", 250)])],
            RANGES,
            PARTS,
            [Whole(0, (Get(whole("a", 250), 250, 450),))],
            id="a large object: in parts, reserving the parts in flight too",
        ),
        pytest.param(
            [(0, [whole("a", 250)])],
            NO_RANGES,
            PARTS,
            [Whole(0, (Get(whole("a", 250), None, 250),))],
            id="a store without ranges: one GET",
        ),
        pytest.param(
            [(0, [whole("a", 250)])],
            RANGES,
            PartsConfig(enabled=False),
            [Whole(0, (Get(whole("a", 250), None, 250),))],
            id="parts disabled: one GET",
        ),
        pytest.param(
            [(0, [whole("a", 250)])],
            CACHE,
            PARTS,
            [Whole(0, (Get(whole("a", 250), None, 250),))],
            id="a whole object a cache wants in one read: one GET",
        ),
        pytest.param(
            [(0, [ranged("a", 0, 250)])],
            CACHE,
            PARTS,
            [Whole(0, (Get(ranged("a", 0, 250), 250, 450),))],
            id="a large span still goes in parts under a cache",
        ),
        pytest.param(
            [(0, [whole("a", 5), whole("b", 6)]), (1, [whole("c", 7)])],
            RANGES,
            PARTS,
            [
                Whole(0, (Get(whole("a", 5), None, 5), Get(whole("b", 6), None, 6))),
                Whole(1, (Get(whole("c", 7), None, 7),)),
            ],
            id="one fetch per sample, in order, all its reads",
        ),
        pytest.param(
            [(0, [ranged("s", 0, 10)]), (1, [ranged("s", 10, 20)]), (2, [whole("a", 5)])],
            RANGES,
            PARTS,
            [
                Whole(0, (Get(ranged("s", 0, 10), None, 10),)),
                Whole(1, (Get(ranged("s", 10, 20), None, 10),)),
                Whole(2, (Get(whole("a", 5), None, 5),)),
            ],
            id="adjacent spans of one shard: one GET each, never merged",
        ),
        pytest.param([], RANGES, PARTS, [], id="an empty batch: nothing"),
    ],
)
def test_plan_fetches(samples, capabilities, parts, plan):
    assert plan_fetches(samples, capabilities, parts) == plan
