"""The one percentile function: nearest rank, over values or a histogram."""

from __future__ import annotations

import pytest

from concurrent_loader.metrics import histogram_percentiles, percentile
from concurrent_loader.metrics.stats import BUCKETS, EDGES


@pytest.mark.parametrize(
    ("q", "expected"),
    [(0, 1), (1, 1), (10, 10), (50, 50), (50.5, 51), (95, 95), (99, 99), (99.01, 100), (100, 100)],
)
def test_nearest_rank_over_values(q, expected):
    values = list(range(100, 0, -1))  # unsorted: the function sorts
    assert percentile(values, q) == expected


def test_small_samples():
    assert percentile([], 50) is None
    assert percentile([3.5], 0) == percentile([3.5], 100) == 3.5
    assert percentile([1, 2], 50) == 1
    assert percentile([1, 2], 51) == 2
    assert percentile([2, 2, 2, 9], 75) == 2


def test_values_are_not_changed():
    values = [3, 1, 2]
    percentile(values, 50)
    assert values == [3, 1, 2]


@pytest.mark.parametrize(("q", "expected"), [(0, 2.0), (10, 2.0), (50, 2.0), (51, 3.0), (100, 3.0)])
def test_nearest_rank_over_a_histogram(q, expected):
    # 0 x 1.0, 5 x 2.0, 5 x 3.0
    assert percentile([1.0, 2.0, 3.0], q, counts=[0, 5, 5]) == expected


def test_empty_histogram():
    assert percentile([1.0, 2.0], 50, counts=[0, 0]) is None


def test_histogram_percentiles_report_bucket_upper_edges():
    counts = [0.0] * BUCKETS
    counts[10] = 90  # 10 us bucket
    counts[40] = 9
    counts[70] = 1
    assert histogram_percentiles(counts) == {"p50": EDGES[10], "p95": EDGES[40], "p99": EDGES[40]}
    counts[70] = 2
    assert histogram_percentiles(counts)["p99"] == EDGES[70]
    assert histogram_percentiles([0.0] * BUCKETS) == {"p50": None, "p95": None, "p99": None}
