"""The one percentile function of the project: nearest rank, over values or a histogram."""

from __future__ import annotations

import math
from collections.abc import Sequence

__all__ = ["percentile"]


def percentile(
    values: Sequence[float], q: float, counts: Sequence[float] | None = None
) -> float | None:
    """The nearest-rank ``q``-th percentile (0-100) of ``values``; None when there are none.
    With ``counts`` (a histogram), ``values`` are sorted and ``values[i]`` occurred ``counts[i]``
    times."""
    if counts is None:
        ordered: Sequence[float] = sorted(values)
        weights: Sequence[float] = [1.0] * len(ordered)
    else:
        ordered, weights = values, counts
    total = sum(weights)
    if not total:
        return None
    rank = max(1.0, math.ceil(total * q / 100))
    seen = 0.0
    for value, weight in zip(ordered, weights, strict=True):
        seen += weight
        if seen >= rank:
            return value
    return ordered[-1]  # pragma: no cover - float rounding only
