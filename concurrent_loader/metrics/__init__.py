"""What the loader measures: per-process counters and histograms merged through shared
memory (:mod:`.stats`), the consumer's stall ledger (:mod:`.stall`), the one percentile
function (:mod:`.percentile`), the bottleneck verdict (:mod:`.verdict`) and the
``stats()`` report (:mod:`.report`)."""

from .percentile import percentile
from .report import format_stats, loader_stats
from .stall import StallLedger
from .stats import SharedStats, StageStats, histogram_percentiles
from .verdict import verdict

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
