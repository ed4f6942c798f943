"""Frozen value objects that configure fetching, each validated once in ``__post_init__``:
a bad value fails at construction with ``ConfigError`` (a ``ValueError``), not in a worker."""

from __future__ import annotations

import math
import operator
import random
import resource
from dataclasses import dataclass, field

from .errors import ConfigError

__all__ = [
    "SELF_TUNED_MAX",
    "SELF_TUNED_START",
    "FetchConfig",
    "HedgeConfig",
    "RetryConfig",
    "Timeouts",
    "check_count",
]


def check_count(name: str, value: object, minimum: int = 1) -> None:
    """Any integer type (numpy's too) >= ``minimum``; bools and floats are refused."""
    try:
        number = operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        number = None
    if isinstance(value, bool) or number is None or number < minimum:
        raise ConfigError(f"{name} must be an int >= {minimum}, got {value!r}")


def _check_seconds(owner: str, name: str, value: object, *, zero: bool) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ConfigError(f"{owner}.{name} must be a finite number of seconds, got {value!r}")
    if value < 0 or (value == 0 and not zero):
        bound = ">= 0" if zero else "> 0"
        raise ConfigError(f"{owner}.{name} must be {bound} seconds, got {value!r}")


@dataclass(frozen=True)
class Timeouts:
    """Seconds allowed for each phase of one GET, so no request hangs a worker
    (``RetryConfig.max_total_seconds`` bounds the object)."""

    connect: float = 10.0
    """Seconds to open a connection (TCP and TLS)."""

    first_byte: float = 30.0
    """Seconds from sending the request to the response's first byte."""

    read: float = 30.0
    """Seconds the body may pause between two chunks."""

    attempt: float = 60.0
    """Seconds one attempt may take in all, send to last body byte (60 s: 1 GiB at 20 MB/s)."""

    def __post_init__(self) -> None:
        for name in ("connect", "first_byte", "read", "attempt"):
            _check_seconds("Timeouts", name, getattr(self, name), zero=False)


@dataclass(frozen=True)
class RetryConfig:
    """Retries of transient failures, with full-jitter exponential backoff, within
    ``max_total_seconds`` per object; errors a retry cannot mend (404, 403, ...) are not retried.

    - a **failure** (5xx, a reset or refused connection, a truncated body, a timeout) gets up
      to ``max_attempts`` attempts (the AWS SDKs' "standard" mode);
    - a **throttle** (503 SlowDown, 429) does not count against ``max_attempts``: it backs off
      with ``throttle_*`` delays, cut short once another GET to the store succeeds. With the
      defaults a SlowDown storm of about 100 s loses nothing.
    """

    max_attempts: int = 3
    """Attempts in all for failures (1: no retry); throttles do not count."""

    base_delay: float = 0.05
    """Seconds: the first retry's wait cap after a failure; it doubles per retry."""

    max_delay: float = 20.0
    """Seconds: the longest wait before a retry after a failure."""

    throttle_base_delay: float = 0.5
    """Seconds: the first retry's wait cap after a throttle (as the AWS SDKs); it doubles."""

    throttle_max_delay: float = 10.0
    """Seconds: the longest wait before a retry after a throttle."""

    max_total_seconds: float = 120.0
    """Seconds one object may take from its first send to its last byte, retries included;
    then it fails with ``FetchTimeout`` (``DeadlineExceeded``), the last error as its cause."""

    throttle_cooldown: float = 0.0
    """Seconds after a throttle during which requests in flight do not grow back."""

    def __post_init__(self) -> None:
        check_count("RetryConfig.max_attempts", self.max_attempts)
        for name in ("base_delay", "max_delay", "throttle_base_delay", "throttle_max_delay"):
            _check_seconds("RetryConfig", name, getattr(self, name), zero=True)
        _check_seconds("RetryConfig", "max_total_seconds", self.max_total_seconds, zero=False)
        _check_seconds("RetryConfig", "throttle_cooldown", self.throttle_cooldown, zero=True)

    def backoff(self, retry: int, rng: random.Random) -> float:
        return rng.uniform(0.0, min(self.max_delay, self.base_delay * (2**retry)))

    def throttle_backoff(self, retry: int, rng: random.Random) -> float:
        cap = self.throttle_base_delay * (2 ** min(retry, 64))
        return rng.uniform(0.0, min(self.throttle_max_delay, cap))


@dataclass(frozen=True)
class HedgeConfig:
    """Hedged GETs ("The Tail at Scale"): a GET without an answer after a delay gets a
    second GET for the same object; the first to complete wins, the other is cancelled.

    The delay is the ``percentile`` of this process's recent GET latencies, within
    ``min_delay`` and ``max_delay``. At most one hedge per attempt, in a free hedge slot
    (``FetchConfig.max_hedges_in_flight``), not while the store throttles most GETs, and
    over ``n`` GETs at most ``5 + budget * n`` hedges.
    """

    enabled: bool = True
    """Whether slow GETs are hedged at all."""

    percentile: float = 98.0
    """The percentile of recent latencies a GET must outlast to be hedged."""

    min_delay: float = 0.02
    """Seconds: the shortest delay before a hedge (scheduling noise is not hedged)."""

    max_delay: float = 2.0
    """Seconds: the longest delay before a hedge (and the delay until latencies are known)."""

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


#: The self-tuned limit's first value (GETs in flight per process): a limit that must first
#: climb costs a short epoch more than a few GETs too many cost the store.
SELF_TUNED_START = 64
#: The most the self-tuned limit grows to: a bound on the sockets a process holds (further
#: held within half the file descriptors it may open), not a tuning choice.
SELF_TUNED_MAX = 1024


@dataclass(frozen=True)
class FetchConfig:
    """Limits of one process's fetch stage, for one store.

    ``max_inflight_requests`` pins the GETs in flight per process (throttles still lower it);
    None self-tunes it: from :data:`SELF_TUNED_START`, up while more GETs in flight keep their
    latency, down under queueing or throttling (:mod:`~.fetch.tuning`), within 4 and
    :attr:`inflight_cap`. At most ``max_inflight_bytes`` of
    fetched, undecoded bodies are held; an object over ``max_object_bytes`` is refused
    (``ObjectTooLarge``) before its body is read.
    """

    max_inflight_requests: int | None = None
    max_inflight_bytes: int = 256 * 1024 * 1024
    max_object_bytes: int = 1024 * 1024 * 1024
    timeouts: Timeouts = field(default_factory=Timeouts)
    retry: RetryConfig = field(default_factory=RetryConfig)
    verify_tls: bool = True
    hedge: HedgeConfig = field(default_factory=HedgeConfig)

    def __post_init__(self) -> None:
        if self.max_inflight_requests is not None:  # None: self-tuned
            check_count("max_inflight_requests", self.max_inflight_requests)
        check_count("max_inflight_bytes", self.max_inflight_bytes)
        check_count("max_object_bytes", self.max_object_bytes)

    @property
    def inflight_start(self) -> int:
        """The attempts in flight to start with: ``max_inflight_requests``, or
        :data:`SELF_TUNED_START`."""
        n = self.max_inflight_requests
        return SELF_TUNED_START if n is None else n

    @property
    def inflight_cap(self) -> int:
        """The most attempts in flight: ``max_inflight_requests``, or the most the self-tuned
        limit may reach (:data:`SELF_TUNED_MAX`, within half the process's file descriptors)."""
        n = self.max_inflight_requests
        if n is not None:
            return n
        descriptors = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        if descriptors == resource.RLIM_INFINITY:
            return SELF_TUNED_MAX
        return max(SELF_TUNED_START, min(SELF_TUNED_MAX, descriptors // 2))

    @property
    def max_hedges_in_flight(self) -> int:
        """Hedged GETs that may be in flight beyond the limit (0 when hedging is off)."""
        if not self.hedge.enabled:
            return 0
        return max(2, math.ceil(2 * self.hedge.budget * self.inflight_cap))

    @property
    def max_connections(self) -> int:
        """Connections a transport may hold open: one per GET that may be in flight."""
        return self.inflight_cap + self.max_hedges_in_flight
