"""How a batch's reads become GETs (``plan_fetches``): a table of inputs and their plans."""

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
)
from concurrent_loader.stores.base import ByteRange, Capabilities

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
