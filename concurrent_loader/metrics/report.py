"""``loader.stats()``: the processes' merged counters and the consumer's stall ledger, as one
dictionary, and as one log line."""

from __future__ import annotations

from typing import Any

from .stall import StallLedger
from .stats import histogram_percentiles
from .verdict import verdict

__all__ = ["format_stats", "loader_stats"]


def loader_stats(
    total: dict[str, Any],
    waits: StallLedger,
    *,
    elapsed: float,
    fetch_slots: int,
    decode_slots: int,
) -> dict[str, Any]:
    """``total`` is :meth:`SharedStats.total`; ``fetch_slots`` and ``decode_slots`` the GETs
    and decode threads allowed over every process, the verdict's denominators."""
    fetch, decode = total["fetch"], total["decode"]
    out: dict[str, Any] = {
        "requests": int(total["objects"]),
        "bytes": int(total["bytes"]),
        "retries": int(total["retries"]),
        "throttles": int(total["throttles"]),
        "hedges": int(total["hedges"]),
        "hedges_won": int(total["hedges_won"]),
        "skipped": int(total["skipped"]),
        "inflight": int(total["inflight"]),
        "batches": waits.steps + waits.warmup_steps,
        "elapsed_s": elapsed,
        "get_latency_s": histogram_percentiles(fetch["counts"]),
        "first_byte_s": histogram_percentiles(total["first_byte"]["counts"]),
        "decode_s_per_image": decode["total"] / decode["count"] if decode["count"] else None,
        "wait_s_per_batch": {f"p{q}": waits.wait_percentile(q) for q in (50, 95, 99)},
        "bytes_per_s": total["bytes"] / elapsed if elapsed else 0.0,
        "images_per_s": decode["count"] / elapsed if elapsed else 0.0,
    }
    # The node-local cache (cache=): reads served from local disk and reads that went to the
    # store. ``requests`` counts both: a hit is a read the fetch client answered too.
    cache_reads = total["cache_hits"] + total["cache_misses"]
    out["cache_hits"] = int(total["cache_hits"])
    out["cache_misses"] = int(total["cache_misses"])
    out["cache_bytes"] = int(total["cache_bytes"])
    out["cache_hit_rate"] = total["cache_hits"] / cache_reads if cache_reads else None
    out["verdict"] = verdict(
        wait_share=waits.wait_share,
        fetch_busy=fetch["total"] / elapsed / fetch_slots if elapsed else 0.0,
        decode_busy=decode["total"] / elapsed / decode_slots if elapsed else 0.0,
        cache_hit_rate=out["cache_hit_rate"],
    )
    return out


def format_stats(stats: dict[str, Any]) -> str:
    p50 = stats["get_latency_s"]["p50"]
    return (
        f"{stats['images_per_s']:.0f} img/s, {stats['bytes_per_s'] / 1e6:.1f} MB/s, "
        f"GET p50 {p50 * 1000 if p50 else 0:.1f} ms, {stats['inflight']} in flight, "
        f"{stats['retries']} retries, {stats['throttles']} throttles, "
        f"{stats['skipped']} skipped"
        + (
            f", cache hits {stats['cache_hit_rate']:.0%}"
            if stats.get("cache_hit_rate") is not None
            else ""
        )
        + f" - {stats['verdict']}"
    )
