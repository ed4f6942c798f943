"""What the loader measures: per-process counters and histograms merged through shared
memory and the cache tally (:mod:`.stats`), the one percentile function
(:mod:`.percentile`), the stall ledger, the verdict and the ``stats()`` report
(:mod:`.report`)."""

from .percentile import percentile
from .report import StallLedger, format_stats, loader_stats, verdict
from .stats import SharedStats, StageStats, histogram_percentiles

__all__ = [
    "SharedStats",
    "StageStats",
    "StallLedger",
    "format_stats",
    "histogram_percentiles",
    "loader_stats",
    "percentile",
    "verdict",
]
