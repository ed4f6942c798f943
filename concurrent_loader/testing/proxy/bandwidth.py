"""Bandwidth caps on what the proxy sends to clients: per connection, and in total.

Both caps are :class:`TokenBucket` s: each connection has its own when
``bandwidth_bytes_per_s`` is set, and all connections share one when ``total_bandwidth``
is set. A connection writes a slice of about 20 ms of the tighter cap, then charges it to
its buckets and sleeps once, until every bucket it charged is out of debt. So:

* the bytes sent to all clients by time ``t`` never exceed ``rate * t`` plus, per
  connection, the slice it has sent but not yet paid for and under a millisecond of debt
  (shorter waits are not slept);
* nothing polls: a connection sleeps for exactly the time its debt needs;
* connections sharing a bucket are served in the order they charged it, which
  interleaves their slices, so concurrent downloads share the total cap evenly.
"""

from __future__ import annotations

import math
from typing import Any

__all__ = ["TokenBucket", "check_rate"]


def check_rate(name: str, value: Any) -> None:
    """ValueError unless ``value`` is None (no cap) or a finite number of bytes/s > 0."""
    if value is not None and (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value <= 0
    ):
        raise ValueError(f"{name} must be > 0 or None, got {value!r}")


class TokenBucket:
    """``rate`` tokens (bytes) a second, of which at most ``burst`` are saved while idle.

    The state is one number, the time up to which the tokens are already spent: the
    tokens available at ``now`` are ``(now - spent_until) * rate``, at most ``burst``,
    and below zero when charges ran ahead (a debt). The caller passes the time, so the
    bucket is a pure calculation, and needs no lock in a single-threaded event loop.
    """

    def __init__(self, rate: float, burst: float = 0.0) -> None:
        check_rate("rate", rate)
        if not math.isfinite(burst) or burst < 0:
            raise ValueError(f"burst must be a finite number >= 0, got {burst!r}")
        self.rate = rate
        self._burst_s = burst / rate
        self._spent_until = -math.inf

    def charge(self, tokens: float, now: float) -> float:
        """Spend ``tokens`` at time ``now``; returns the seconds until the debt is paid."""
        # Time left idle refills the bucket, but only up to the burst.
        self._spent_until = max(self._spent_until, now - self._burst_s) + tokens / self.rate
        return max(0.0, self._spent_until - now)
