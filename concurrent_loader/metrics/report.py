"""``loader.stats()``: merged counters and the consumer's stall ledger as one dictionary and
one log line, with a verdict naming the stage that limits throughput.

:class:`StallLedger` is the one stall ledger (also :class:`~concurrent_loader.gpu.StallMeter`'s):
a step is ``(wait, compute)``; warm-up steps are counted apart, so shares and percentiles
describe the steady state.
"""

from __future__ import annotations

import threading
from typing import Any

from .stats import COUNTERS, histogram_percentiles, percentile

__all__ = ["StallLedger", "format_stats", "loader_stats", "verdict"]


class StallLedger:
    """Per-step waits and computes, warm-up steps kept apart. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.waits: list[float] = []
        self.computes: list[float] = []
        self.samples = 0
        self.warmup_steps = 0

    def record(
        self, wait: float, compute: float, samples: int = 0, *, warmup: bool = False
    ) -> None:
        with self._lock:
            if warmup:
                self.warmup_steps += 1
                return
            self.waits.append(wait)
            self.computes.append(compute)
            self.samples += samples

    @property
    def steps(self) -> int:
        return len(self.waits)

    @property
    def wait_s(self) -> float:
        return sum(self.waits)

    @property
    def compute_s(self) -> float:
        return sum(self.computes)

    @property
    def wait_share(self) -> float:
        total = self.wait_s + self.compute_s
        return self.wait_s / total if total > 0 else 0.0

    def wait_percentile(self, q: float) -> float | None:
        return percentile(self.waits, q)

    def step_percentile(self, q: float) -> float | None:
        return percentile([w + c for w, c in zip(self.waits, self.computes, strict=True)], q)


def verdict(
    *,
    wait_share: float,
    fetch_busy: float,
    decode_busy: float,
    cache_hit_rate: float | None = None,
    actors: int | None = None,
) -> str:
    """One line naming the bottleneck and what to change, from the loop's ``wait_share``, the
    shares of fetch slots and decode threads busy, and the cache's hit rate (None: no cache);
    ``actors``: the batches are made on that many Ray actors (remote prep)."""
    if wait_share < 0.1:
        return f"training step: the loader keeps up (the loop waited {wait_share:.0%} of the time)"
    more = "num_workers" if actors is None else f"RayExecutor(actors=...) (now {actors})"
    where = "" if actors is None else f" on the {actors} Ray actors"
    if max(fetch_busy, decode_busy) < 0.5:
        if actors is not None:
            return (
                f"remote prep: the loop waited {wait_share:.0%} of the time, yet fetch slots "
                f"were only {fetch_busy:.0%} and decode threads {decode_busy:.0%} busy{where}: "
                "batches wait on their way through Ray's object store, or too few are in "
                "flight; raise RayExecutor(max_batches_in_flight=...)"
            )
        return (
            f"loader: the loop waited {wait_share:.0%} of the time, yet fetch slots were only "
            f"{fetch_busy:.0%} and decode threads {decode_busy:.0%} busy; raise "
            "prefetch_batches or num_workers"
        )
    if fetch_busy >= decode_busy:
        line = (
            f"storage: the loop waited {wait_share:.0%} of the time and fetch slots{where} were "
            f"{fetch_busy:.0%} busy; raise the dataset's "
            f"`FetchConfig.max_inflight_requests` or {more}"
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
        f"decode{where}: the loop waited {wait_share:.0%} of the time and decode threads were "
        f"{decode_busy:.0%} busy; raise {more} or decode_threads, or use image_size"
    )


def loader_stats(
    total: dict[str, Any],
    waits: StallLedger,
    *,
    elapsed: float,
    fetch_slots: int,
    decode_slots: int,
    actors: int | None = None,
) -> dict[str, Any]:
    """``total`` is :meth:`SharedStats.total`; ``fetch_slots`` and ``decode_slots`` the GETs
    and decode threads allowed over every process; ``actors``: made on Ray actors."""
    fetch, decode = total["fetch"], total["decode"]
    # Every counter by its name, but ``objects``: ``requests`` (a cache hit is a read the
    # fetch client answered too, so it counts hits and misses).
    out: dict[str, Any] = {name: int(total[name]) for name in COUNTERS if name != "objects"}
    cache_reads = total["cache_hits"] + total["cache_misses"]
    out |= {
        "requests": int(total["objects"]),
        "cache_hit_rate": total["cache_hits"] / cache_reads if cache_reads else None,
        "batches": waits.steps + waits.warmup_steps,
        "elapsed_s": elapsed,
        "get_latency_s": histogram_percentiles(fetch["counts"]),
        "first_byte_s": histogram_percentiles(total["first_byte"]["counts"]),
        "decode_s_per_image": decode["total"] / decode["count"] if decode["count"] else None,
        "wait_s_per_batch": {f"p{q}": waits.wait_percentile(q) for q in (50, 95, 99)},
        "bytes_per_s": total["bytes"] / elapsed if elapsed else 0.0,
        "images_per_s": decode["count"] / elapsed if elapsed else 0.0,
    }
    out["busy"] = {
        "fetch": fetch["total"] / elapsed / fetch_slots if elapsed else 0.0,
        "decode": decode["total"] / elapsed / decode_slots if elapsed else 0.0,
    }
    out["verdict"] = verdict(
        wait_share=waits.wait_share,
        fetch_busy=out["busy"]["fetch"],
        decode_busy=out["busy"]["decode"],
        cache_hit_rate=out["cache_hit_rate"],
        actors=actors,
    )
    return out


def format_stats(stats: dict[str, Any]) -> str:
    p50 = stats["get_latency_s"]["p50"]
    rate = stats.get("cache_hit_rate")
    return (
        f"{stats['images_per_s']:.0f} img/s, {stats['bytes_per_s'] / 1e6:.1f} MB/s, "
        f"GET p50 {p50 * 1000 if p50 else 0:.1f} ms, {stats['inflight']} in flight, "
        f"{stats['retries']} retries, {stats['throttles']} throttles, "
        f"{stats['skipped']} skipped{'' if rate is None else f', cache hits {rate:.0%}'}"
        f" - {stats['verdict']}"
    )
