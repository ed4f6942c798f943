"""PipelineOptions: validated once; defaults derived in one place."""

from __future__ import annotations

import pytest

from concurrent_loader import ConfigError, FetchConfig, Reason
from concurrent_loader.pipeline import PipelineOptions, available_cpus, worker_count
from concurrent_loader.pipeline.options import cores


@pytest.fixture(autouse=True)
def _one_rank(monkeypatch):
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)  # the budget's default divides by it


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
def test_decode_threads_start_at_the_processs_share_of_the_cpus(num_workers):
    options = PipelineOptions.derive(
        fetch_config=FetchConfig(), batch_size=4, num_workers=num_workers
    )
    assert options.decode_threads == max(1, min(8, available_cpus() // max(1, num_workers)))
    assert options.max_decode_threads == max(
        options.decode_threads, -(-available_cpus() // max(1, num_workers))
    )


@pytest.mark.parametrize(
    ("cpu_budget", "num_workers", "start", "most"),
    [(16, 1, 8, 16), (16, 2, 8, 8), (3, 2, 1, 2), (1, 4, 1, 1), (0.5, 0, 1, 1), (24, 0, 8, 24)],
)
def test_auto_decode_threads_tune_within_the_processs_share_of_the_budget(
    cpu_budget, num_workers, start, most
):
    for auto in (None, "auto"):
        options = PipelineOptions.derive(
            fetch_config=FetchConfig(),
            batch_size=4,
            num_workers=num_workers,
            decode_threads=auto,
            cpu_budget=cpu_budget,
        )
        assert (options.decode_threads, options.max_decode_threads) == (start, most)


def test_a_dataset_that_is_not_ours_has_no_decode_threads_to_tune():
    options = PipelineOptions.derive(fetch_config=None, batch_size=4, num_workers=0, cpu_budget=8)
    assert options.max_decode_threads is None


def test_a_given_decode_thread_count_is_pinned():
    options = PipelineOptions.derive(
        fetch_config=None, batch_size=4, num_workers=0, decode_threads=3, cpu_budget=16
    )
    assert (options.decode_threads, options.max_decode_threads) == (3, None)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"cpu_budget": 0}, "cpu_budget must be a number of cores > 0"),
        ({"cpu_budget": "all"}, "cpu_budget must be a number of cores > 0"),
        ({"cpu_budget": float("inf")}, "cpu_budget must be a number of cores > 0"),
        ({"cpu_budget": True}, "cpu_budget must be a number of cores > 0"),
        ({"decode_threads": "many"}, "take a count, None or 'auto'"),
        ({"prefetch_batches": "lots"}, "take a count, None or 'auto'"),
    ],
)
def test_bad_auto_settings_are_refused(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        PipelineOptions.derive(fetch_config=None, batch_size=4, num_workers=0, **kwargs)


def test_a_most_below_the_start_is_refused():
    with pytest.raises(ConfigError, match="max_decode_threads"):
        PipelineOptions(decode_threads=4, max_decode_threads=2)


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
    [(None, None, True), (None, "auto", True), (64, None, False), (None, 3, False)],
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
    assert options.prefetch_batches == (3 if prefetch in (None, "auto") else prefetch)


def test_a_dataset_that_is_not_ours_never_follows_a_limit():
    options = PipelineOptions.derive(fetch_config=None, batch_size=16, num_workers=0)
    assert options.follow_limit is False


@pytest.mark.parametrize(
    ("budget", "expected"), [(None, max(1, available_cpus())), (2.5, 2), (0.5, 1), (16, 16)]
)
def test_auto_workers_are_a_process_per_core_of_the_budget(budget, expected):
    assert worker_count("auto", budget) == expected
    assert worker_count(3, budget) == 3  # a count is torch's


def test_the_default_budget_is_shared_among_the_nodes_ranks(monkeypatch):
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    assert cores(None) == available_cpus() / 4
    for unreadable in ("", "two", "\u00b2", "0"):
        monkeypatch.setenv("LOCAL_WORLD_SIZE", unreadable)
        assert cores(None) == available_cpus()
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    assert worker_count("auto", None) == max(1, available_cpus() // 4)
    assert worker_count("auto", 8) == 8  # a given budget is the rank's own


def test_num_workers_other_than_a_count_or_auto_are_refused():
    with pytest.raises(ConfigError, match="num_workers takes a count or 'auto', got 'many'"):
        worker_count("many", None)
