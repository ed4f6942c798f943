"""Small frozen value objects that configure fetching.

Every limit the loader enforces lives here, validated once in ``__post_init__`` so a bad
value fails at construction with a ``ConfigError`` (a ``ValueError``), not deep inside a
worker process.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

from .errors import ConfigError

__all__ = ["SELF_TUNED_CAP", "FetchConfig", "HedgeConfig", "RetryConfig", "Timeouts"]


def _check_seconds(owner: str, name: str, value: object, *, zero: bool) -> None:
    """``value`` is a finite number of seconds, > 0 (>= 0 when ``zero``)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ConfigError(f"{owner}.{name} must be a finite number of seconds, got {value!r}")
    if value < 0 or (value == 0 and not zero):
        bound = ">= 0" if zero else "> 0"
        raise ConfigError(f"{owner}.{name} must be {bound} seconds, got {value!r}")


@dataclass(frozen=True)
class Timeouts:
    """Seconds allowed for each phase of one GET, and for the whole of it. No request can
    hang a worker forever.

    ``read`` is the longest stall allowed between two chunks of the body, not the time for
    the whole body, so large objects on slow links are not cut off while they still flow;
    ``attempt`` bounds the whole attempt, so a server that trickles (a byte every few
    seconds, each within ``read``) cannot hold one forever either. The object as a whole
    is bounded by ``RetryConfig.max_total_seconds``.
    """

    connect: float = 10.0
    """Seconds to open a connection (TCP and TLS)."""

    first_byte: float = 30.0
    """Seconds from sending the request to the response's first byte."""

    read: float = 30.0
    """Seconds the body may pause between two chunks."""

    attempt: float = 60.0
    """Seconds one attempt may take in all, from its send to its last body byte, whatever
    the phases above allow: 60 s lets a 1 GiB object (the default ``max_object_bytes``)
    arrive at 20 MB/s, and cuts off a trickling server so that a retry can go elsewhere."""

    def __post_init__(self) -> None:
        for name in ("connect", "first_byte", "read", "attempt"):
            _check_seconds("Timeouts", name, getattr(self, name), zero=False)


@dataclass(frozen=True)
class RetryConfig:
    """How transient failures are retried: exponential backoff with full jitter, within a
    time budget per object.

    Two kinds of transient failure are told apart:

    - a **failure** (5xx other than SlowDown, a reset or refused connection, a truncated
      body, a timeout) is retried up to ``max_attempts`` attempts in all, ``base_delay`` and
      ``max_delay`` apart (the AWS SDKs' "standard" mode: 3 attempts, a delay drawn
      uniformly from ``[0, min(max_delay, base_delay * 2**retry)]``);
    - a **throttle** (503 SlowDown, 429, RequestLimitExceeded: :class:`Throttled`) is not a
      failure: the store is asking for fewer requests, so it is retried with its own, longer
      backoff (``throttle_base_delay``, ``throttle_max_delay``), cut short as soon as
      another GET to the store succeeds, never counted against ``max_attempts``, for as
      long as ``max_total_seconds`` allows, while the process also cuts its requests in
      flight (once per round, by half the fraction throttled; see
      :mod:`concurrent_loader.fetch.tuning`) and grows them back when throttles stop.

    With the defaults a SlowDown storm of up to about 100 s loses nothing: each object waits
    it out, and resumes as soon as one GET of the process gets through after its end (at
    most ``throttle_max_delay`` after it). Errors that a retry cannot mend (404, 403, ...)
    are never retried.
    """

    max_attempts: int = 3
    """Attempts in all (the first and its retries) for failures other than throttles;
    1 means no retry. Throttles do not count."""

    base_delay: float = 0.05
    """Seconds: the first retry after a failure waits up to this; each further retry up to
    twice as long as the one before, at most ``max_delay``."""

    max_delay: float = 20.0
    """Seconds: the longest wait before a retry after a failure."""

    throttle_base_delay: float = 0.5
    """Seconds: the first retry after a throttle waits up to this, each further one up to
    twice as long, at most ``throttle_max_delay`` (0.5 s as the AWS SDKs' throttling
    backoff: a store that throttles needs time, not a quick second try)."""

    throttle_max_delay: float = 10.0
    """Seconds: the longest wait before a retry after a throttle, so an object waiting out
    a SlowDown storm retries at least this often and resumes at most this long after it."""

    max_total_seconds: float = 120.0
    """Seconds one object may take from its first attempt's send to its last byte: attempts,
    backoff between them and waiting for a free request slot for a retry (waiting for the
    first slot, behind the process's other GETs, does not count). It holds however the
    server behaves (trickling, stalling, never answering, throttling without end): when it
    runs out, or a retry could not start before it does, the object fails with
    ``FetchTimeout`` (``Reason.DEADLINE_EXCEEDED``), the last attempt's error as its
    ``__cause__``."""

    throttle_cooldown: float = 0.0
    """Seconds after a throttle during which the process's requests in flight do not grow
    back (0: they grow again from the next round without a throttle; the once-per-round
    cut already keeps a throttling store from being probed too hard)."""

    def __post_init__(self) -> None:
        attempts = self.max_attempts
        if isinstance(attempts, bool) or not isinstance(attempts, int) or attempts < 1:
            raise ConfigError(f"RetryConfig.max_attempts must be an int >= 1, got {attempts!r}")
        for name in ("base_delay", "max_delay", "throttle_base_delay", "throttle_max_delay"):
            _check_seconds("RetryConfig", name, getattr(self, name), zero=True)
        _check_seconds("RetryConfig", "max_total_seconds", self.max_total_seconds, zero=False)
        _check_seconds("RetryConfig", "throttle_cooldown", self.throttle_cooldown, zero=True)

    def backoff(self, retry: int, rng: random.Random) -> float:
        """Delay before retry number ``retry`` (0-based) after a failure: full jitter."""
        return rng.uniform(0.0, min(self.max_delay, self.base_delay * (2**retry)))

    def throttle_backoff(self, retry: int, rng: random.Random) -> float:
        """Delay before retry number ``retry`` (0-based) after a throttle: full jitter."""
        cap = self.throttle_base_delay * (2 ** min(retry, 64))
        return rng.uniform(0.0, min(self.throttle_max_delay, cap))


@dataclass(frozen=True)
class HedgeConfig:
    """Hedged GETs, after "The Tail at Scale" (Dean and Barroso, 2013): a GET that has no
    answer after a delay gets one more GET for the same object, and whichever completes
    first is used (the other is cancelled, its connection closed).

    The delay is the ``percentile``-th percentile of the latencies of this process's recent
    GETs to the store (whole GETs, first send to last byte), kept within ``min_delay`` and
    ``max_delay``; until a few GETs have completed it is ``max_delay``. At most one hedge
    is sent per attempt, and only when one of the few hedge slots beyond the in-flight
    limit is free (``FetchConfig.max_hedges_in_flight``: a hedge never waits behind the
    GETs it is meant to overtake) and the store did not throttle most GETs of the last
    round (hedging a store in a SlowDown storm would hit it harder). Hedges spend a token
    bucket that each GET fills by ``budget`` (at most 10 tokens, 5 at the start): over
    ``n`` GETs at most ``5 + budget * n`` hedges are sent, so a store that is slow for
    everyone sees at most ``budget`` more GETs, never twice as many. Hedges are paced, at
    most four per delay, oldest GET first, so GETs that come due together (a burst that
    only queues at the store) do not take every token at once. If the hedge fails
    (transiently) while its GET still has no answer, the attempt fails with the hedge's
    error and is retried: the GET that outlasted the delay and its hedge is presumed
    stalled, and is cancelled rather than waited for until ``Timeouts.read``.
    """

    enabled: bool = True
    """Whether slow GETs are hedged at all."""

    percentile: float = 98.0
    """Which percentile of recent latencies a GET must outlast to be hedged (p98: about
    one GET in fifty, well within ``budget``, so tokens are left whenever a GET stalls or
    straggles, which is what hedging is for; p95 would spend the whole 5 % budget on the
    ordinary tail)."""

    min_delay: float = 0.02
    """Seconds: the shortest delay before a hedge, so that scheduling noise on a fast
    store (a few ms per GET) is not hedged."""

    max_delay: float = 2.0
    """Seconds: the longest delay before a hedge, however slow recent GETs were (the 2 s
    after which AWS advises retrying a slow S3 request), and the delay before enough
    latencies are known."""

    budget: float = 0.05
    """Hedges allowed per GET sent, in the long run (0.05: at most 5 % more GETs)."""

    def __post_init__(self) -> None:
        if not isinstance(self.enabled, bool):
            raise ConfigError(f"HedgeConfig.enabled must be a bool, got {self.enabled!r}")
        q = self.percentile
        if isinstance(q, bool) or not isinstance(q, (int, float)) or not 0 < q < 100:
            raise ConfigError(f"HedgeConfig.percentile must be in (0, 100), got {q!r}")
        _check_seconds("HedgeConfig", "min_delay", self.min_delay, zero=False)
        _check_seconds("HedgeConfig", "max_delay", self.max_delay, zero=False)
        if self.max_delay < self.min_delay:
            raise ConfigError(
                f"HedgeConfig.max_delay ({self.max_delay!r}) must be >= min_delay "
                f"({self.min_delay!r})"
            )
        b = self.budget
        if isinstance(b, bool) or not isinstance(b, (int, float)) or not 0 < b <= 1:
            raise ConfigError(f"HedgeConfig.budget must be in (0, 1], got {b!r}")


#: The most GETs in flight per process when ``max_inflight_requests`` is not given.
SELF_TUNED_CAP = 64


@dataclass(frozen=True)
class FetchConfig:
    """Limits of one process's fetch stage, for one store.

    ``max_inflight_requests`` pins the GETs in flight per process to at most that number
    (throttles still lower it for a while); left as None, the number is **self-tuned**
    between 4 and :data:`SELF_TUNED_CAP` (64) from what is measured: throttles, and GET
    latency against its unloaded baseline (see :mod:`concurrent_loader.fetch.tuning`). On
    top of either, up to ``max_hedges_in_flight`` hedged GETs may be in flight. At most
    ``max_inflight_bytes`` of fetched-but-not-yet-decoded bodies are held (whatever the
    limit, this bounds memory); an object larger than ``max_object_bytes`` is refused with
    ``ObjectTooLarge`` before its body is read. ``timeouts`` bound each GET, ``retry`` what
    follows a failed one, ``hedge`` when a slow one gets a second GET.
    """

    max_inflight_requests: int | None = None
    max_inflight_bytes: int = 256 * 1024 * 1024
    max_object_bytes: int = 1024 * 1024 * 1024
    timeouts: Timeouts = field(default_factory=Timeouts)
    retry: RetryConfig = field(default_factory=RetryConfig)
    verify_tls: bool = True
    hedge: HedgeConfig = field(default_factory=HedgeConfig)

    def __post_init__(self) -> None:
        n = self.max_inflight_requests
        if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
            raise ConfigError(f"max_inflight_requests must be an int >= 1 or None, got {n!r}")
        if self.max_inflight_bytes < 1:
            raise ConfigError(f"max_inflight_bytes must be >= 1, got {self.max_inflight_bytes}")
        if self.max_object_bytes < 1:
            raise ConfigError(f"max_object_bytes must be >= 1, got {self.max_object_bytes}")

    @property
    def inflight_cap(self) -> int:
        """The most attempts in flight: ``max_inflight_requests``, or the self-tuned cap."""
        n = self.max_inflight_requests
        return SELF_TUNED_CAP if n is None else n

    @property
    def max_hedges_in_flight(self) -> int:
        """Hedged GETs that may be in flight beyond the limit: twice the hedge budget's
        share of ``inflight_cap``, at least 2 (0 when hedging is off)."""
        if not self.hedge.enabled:
            return 0
        return max(2, math.ceil(2 * self.hedge.budget * self.inflight_cap))

    @property
    def max_connections(self) -> int:
        """Connections a transport may hold open: one per GET that may be in flight."""
        return self.inflight_cap + self.max_hedges_in_flight
