"""What the loader measures, merged across processes, and the ``stats()`` report."""

from .report import StallLedger, format_stats, loader_stats, verdict
from .stats import SharedStats, StageStats, histogram_percentiles, percentile

__all__ = ["SharedStats", "StageStats", "StallLedger", "format_stats", "histogram_percentiles"]
__all__ += ["loader_stats", "percentile", "verdict"]
