"""Which stage limits throughput: a pure function of three shares, tested as a table."""

from __future__ import annotations

__all__ = ["verdict"]


def verdict(
    *,
    wait_share: float,
    fetch_busy: float,
    decode_busy: float,
    cache_hit_rate: float | None = None,
) -> str:
    """One line naming the bottleneck and what to change.

    ``wait_share``: the training loop's share of time waiting for batches (steady state);
    ``fetch_busy``: GETs in flight / allowed, averaged; ``decode_busy``: decode threads busy
    / available, averaged; ``cache_hit_rate``: the share of reads the node-local cache
    served, None without a cache. When storage is the bottleneck the line names the cache:
    what it served, or that there is none.
    """
    if wait_share < 0.1:
        return f"training step: the loader keeps up (the loop waited {wait_share:.0%} of the time)"
    if max(fetch_busy, decode_busy) < 0.5:
        return (
            f"loader: the loop waited {wait_share:.0%} of the time, yet fetch slots were only "
            f"{fetch_busy:.0%} and decode threads {decode_busy:.0%} busy; raise "
            "prefetch_batches or num_workers"
        )
    if fetch_busy >= decode_busy:
        line = (
            f"storage: the loop waited {wait_share:.0%} of the time and fetch slots were "
            f"{fetch_busy:.0%} busy; raise max_inflight_requests or num_workers"
        )
        if cache_hit_rate is None:
            return f"{line}, or cache= the dataset on local disk for the epochs after the first"
        if cache_hit_rate < 0.95:
            return (
                f"{line}; the cache served {cache_hit_rate:.0%} of reads: a larger cache "
                "budget (CacheConfig.max_bytes) serves more from local disk from the next epoch"
            )
        return f"{line}; the cache served {cache_hit_rate:.0%} of reads"
    return (
        f"decode: the loop waited {wait_share:.0%} of the time and decode threads were "
        f"{decode_busy:.0%} busy; raise num_workers or decode_threads, or use image_size"
    )
