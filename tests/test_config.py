"""Fetch settings are validated once, at construction, as ConfigError (a ValueError)."""

from __future__ import annotations

import pytest

from concurrent_loader import ConfigError, FetchConfig, RetryConfig, Timeouts


@pytest.mark.parametrize(
    "make",
    [
        lambda: Timeouts(connect=0),
        lambda: Timeouts(first_byte=-1),
        lambda: Timeouts(read=0.0),
        lambda: Timeouts(attempt=0),
        lambda: Timeouts(attempt=float("inf")),
        lambda: RetryConfig(max_attempts=0),
        lambda: RetryConfig(base_delay=-0.1),
        lambda: RetryConfig(max_delay=-1),
        lambda: RetryConfig(max_total_seconds=0),
        lambda: RetryConfig(throttle_cooldown=-1),
        lambda: RetryConfig(max_attempts=2.5),  # type: ignore[arg-type]
        lambda: RetryConfig(max_attempts=True),
        lambda: RetryConfig(throttle_base_delay=-1),
        lambda: RetryConfig(throttle_max_delay=float("nan")),
        lambda: RetryConfig(max_total_seconds=float("inf")),
        lambda: RetryConfig(base_delay="0.1"),  # type: ignore[arg-type]
        lambda: FetchConfig(max_inflight_requests=0),
        lambda: FetchConfig(max_inflight_bytes=0),
        lambda: FetchConfig(max_object_bytes=0),
    ],
)
def test_invalid_values_fail_at_construction(make):
    with pytest.raises(ConfigError):
        make()
    with pytest.raises(ValueError):
        make()


def test_defaults_follow_the_aws_standard_retry_mode():
    retry = RetryConfig()
    assert retry.max_attempts == 3
    assert (retry.base_delay, retry.max_delay) == (0.05, 20.0)
    # Throttles wait longer, and the budget outlasts a 30 s SlowDown storm with room for
    # the longest throttle backoff after it.
    assert retry.throttle_base_delay >= 10 * retry.base_delay
    assert retry.max_total_seconds >= 30 + 2 * retry.throttle_max_delay
    assert FetchConfig().retry == retry


def test_configs_are_frozen_and_hashable():
    config = FetchConfig(max_inflight_requests=4)
    with pytest.raises(AttributeError):
        config.max_inflight_requests = 5  # type: ignore[misc]
    assert hash(config) == hash(FetchConfig(max_inflight_requests=4))
    assert config.max_connections == 4 + config.max_hedges_in_flight  # hedges beyond the limit


def test_counts_take_any_integer_type_but_not_bools_or_floats():
    np = pytest.importorskip("numpy")
    assert FetchConfig(max_inflight_bytes=np.int64(1 << 28)).max_inflight_bytes == 1 << 28
    for bad in (True, 1.0, np.float64(8.0), 0):
        with pytest.raises(ConfigError, match="max_inflight_bytes must be an int >= 1"):
            FetchConfig(max_inflight_bytes=bad)


def test_a_self_tuned_limit_starts_at_64_and_may_grow_within_half_the_descriptors():
    import resource

    from concurrent_loader.config import SELF_TUNED_MAX, SELF_TUNED_START

    config = FetchConfig()
    assert config.inflight_start == SELF_TUNED_START == 64
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    expected = SELF_TUNED_MAX if soft == resource.RLIM_INFINITY else soft // 2
    assert config.inflight_cap == max(SELF_TUNED_START, min(SELF_TUNED_MAX, expected))
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))
        assert config.inflight_cap == 128  # 256 descriptors: 128 sockets at most
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    pinned = FetchConfig(max_inflight_requests=300)
    assert pinned.inflight_start == pinned.inflight_cap == 300
