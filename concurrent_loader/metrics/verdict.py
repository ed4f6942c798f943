"""Which stage limits throughput: a pure function of three shares, tested as a table."""

from __future__ import annotations

__all__ = ["verdict"]


def verdict(*, wait_share: float, fetch_busy: float, decode_busy: float) -> str:
    """One line naming the bottleneck and what to change.

    ``wait_share``: the training loop's share of time waiting for batches (steady state);
    ``fetch_busy``: GETs in flight / allowed, averaged; ``decode_busy``: decode threads busy
    / available, averaged.
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
        return (
            f"storage: the loop waited {wait_share:.0%} of the time and fetch slots were "
            f"{fetch_busy:.0%} busy; raise max_inflight_requests or num_workers"
        )
    return (
        f"decode: the loop waited {wait_share:.0%} of the time and decode threads were "
        f"{decode_busy:.0%} busy; raise num_workers or decode_threads, or use image_size"
    )
