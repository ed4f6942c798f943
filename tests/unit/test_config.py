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
        lambda: RetryConfig(max_attempts=0),
        lambda: RetryConfig(base_delay=-0.1),
        lambda: RetryConfig(max_delay=-1),
        lambda: RetryConfig(max_total_seconds=0),
        lambda: RetryConfig(throttle_cooldown=-1),
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
    assert FetchConfig().retry == retry


def test_configs_are_frozen_and_hashable():
    config = FetchConfig(max_inflight_requests=4)
    with pytest.raises(AttributeError):
        config.max_inflight_requests = 5  # type: ignore[misc]
    assert hash(config) == hash(FetchConfig(max_inflight_requests=4))
    assert config.max_connections == 4
