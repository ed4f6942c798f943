"""Small frozen value objects that configure fetching.

Every limit the loader enforces lives here, validated once in ``__post_init__`` so a bad
value fails at construction with a ``ConfigError`` (a ``ValueError``), not deep inside a
worker process.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from .errors import ConfigError

__all__ = ["FetchConfig", "RetryConfig", "Timeouts"]


@dataclass(frozen=True)
class Timeouts:
    """Seconds allowed for each phase of one GET. No request can hang a worker forever.

    ``read`` is the longest stall allowed between two chunks of the body, not the time for
    the whole body, so large objects on slow links are not cut off while they still flow.
    """

    connect: float = 10.0
    first_byte: float = 30.0
    read: float = 30.0

    def __post_init__(self) -> None:
        for name in ("connect", "first_byte", "read"):
            value = getattr(self, name)
            if not value > 0:
                raise ConfigError(f"Timeouts.{name} must be > 0 seconds, got {value!r}")


@dataclass(frozen=True)
class RetryConfig:
    """Retries of transient failures: exponential backoff with full jitter.

    The defaults follow the AWS SDKs' "standard" retry mode: 3 attempts in all, a delay
    drawn uniformly from ``[0, min(max_delay, base_delay * 2**retry)]``. ``max_total_seconds``
    caps the time one object may spend in retries. On a throttle (503 SlowDown, 429) the
    process also lowers its number of requests in flight for ``throttle_cooldown`` seconds.
    """

    max_attempts: int = 3
    base_delay: float = 0.05
    max_delay: float = 20.0
    max_total_seconds: float = 120.0
    throttle_cooldown: float = 5.0

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ConfigError(f"RetryConfig.max_attempts must be >= 1, got {self.max_attempts}")
        if self.base_delay < 0 or self.max_delay < 0:
            raise ConfigError("RetryConfig delays must be >= 0")
        if not self.max_total_seconds > 0:
            raise ConfigError("RetryConfig.max_total_seconds must be > 0")
        if self.throttle_cooldown < 0:
            raise ConfigError("RetryConfig.throttle_cooldown must be >= 0")

    def backoff(self, retry: int, rng: random.Random) -> float:
        """Delay before retry number ``retry`` (0-based): full jitter."""
        return rng.uniform(0.0, min(self.max_delay, self.base_delay * (2**retry)))


@dataclass(frozen=True)
class FetchConfig:
    """Limits of one process's fetch stage, for one store.

    ``max_inflight_requests`` GETs at most are in flight at once (nothing else: every other
    size is its own setting or derived here), and at most
    ``max_inflight_bytes`` of fetched-but-not-yet-decoded bodies are held; an object larger
    than ``max_object_bytes`` is refused with ``ObjectTooLarge`` before its body is read.
    """

    max_inflight_requests: int = 64
    max_inflight_bytes: int = 256 * 1024 * 1024
    max_object_bytes: int = 1024 * 1024 * 1024
    timeouts: Timeouts = field(default_factory=Timeouts)
    retry: RetryConfig = field(default_factory=RetryConfig)
    verify_tls: bool = True

    def __post_init__(self) -> None:
        if self.max_inflight_requests < 1:
            raise ConfigError(
                f"max_inflight_requests must be >= 1, got {self.max_inflight_requests}"
            )
        if self.max_inflight_bytes < 1:
            raise ConfigError(f"max_inflight_bytes must be >= 1, got {self.max_inflight_bytes}")
        if self.max_object_bytes < 1:
            raise ConfigError(f"max_object_bytes must be >= 1, got {self.max_object_bytes}")

    @property
    def max_connections(self) -> int:
        """Connections a transport may hold open: one per GET that may be in flight."""
        return self.max_inflight_requests
