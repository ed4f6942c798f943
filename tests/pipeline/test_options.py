"""PipelineOptions: validated once; defaults derived in one place."""

from __future__ import annotations

import pytest

from concurrent_loader import ConfigError, FetchConfig, Reason
from concurrent_loader.pipeline import PipelineOptions, available_cpus


@pytest.mark.parametrize(
    "kwargs",
    [
        {"decode_threads": 0},
        {"getitem_threads": 0},
        {"prefetch_batches": 0},
        {"on_error": "ignore"},
        {"stall_timeout_s": 0},
    ],
)
def test_invalid_options_are_refused(kwargs):
    with pytest.raises(ConfigError) as caught:
        PipelineOptions(**kwargs)
    assert caught.value.cause is Reason.INVALID_ARGUMENT


@pytest.mark.parametrize(
    ("inflight", "batch_size", "expected"),
    [(64, 1, 65), (64, 32, 3), (64, 64, 2), (8, 256, 2), (10, 3, 5), (None, 32, 3)],
)
def test_prefetch_batches_keep_the_datasets_requests_busy_plus_one(inflight, batch_size, expected):
    options = PipelineOptions.derive(
        fetch_config=FetchConfig(max_inflight_requests=inflight),
        batch_size=batch_size,
        num_workers=0,
    )
    assert options.prefetch_batches == expected


def test_a_dataset_that_is_not_ours_is_sized_for_64_calls():
    options = PipelineOptions.derive(fetch_config=None, batch_size=16, num_workers=0)
    assert options.prefetch_batches == 5


@pytest.mark.parametrize("num_workers", [0, 1, 2, 64])
def test_decode_threads_are_the_processs_share_of_the_cpus(num_workers):
    options = PipelineOptions.derive(fetch_config=None, batch_size=4, num_workers=num_workers)
    assert options.decode_threads == max(1, min(8, available_cpus() // max(1, num_workers)))


def test_given_values_are_kept():
    options = PipelineOptions.derive(
        fetch_config=FetchConfig(),
        batch_size=4,
        num_workers=2,
        decode_threads=3,
        getitem_threads=5,
        prefetch_batches=7,
        on_error="skip",
    )
    assert (options.decode_threads, options.getitem_threads, options.prefetch_batches) == (3, 5, 7)
    assert options.on_error == "skip"


def test_fetching_is_left_to_the_datasets_fetch_config():
    assert not hasattr(PipelineOptions(), "fetch_config")
    assert not hasattr(PipelineOptions(), "max_inflight_bytes")


@pytest.mark.parametrize(
    ("inflight", "prefetch", "follows"),
    [(None, None, True), (64, None, False), (None, 3, False)],
)
def test_batches_follow_the_fetch_limit_only_when_both_are_left_to_tune(
    inflight, prefetch, follows
):
    options = PipelineOptions.derive(
        fetch_config=FetchConfig(max_inflight_requests=inflight),
        batch_size=32,
        num_workers=0,
        prefetch_batches=prefetch,
    )
    assert options.follow_limit is follows
    assert options.prefetch_batches == (prefetch or 3)


def test_a_dataset_that_is_not_ours_never_follows_a_limit():
    options = PipelineOptions.derive(fetch_config=None, batch_size=16, num_workers=0)
    assert options.follow_limit is False
