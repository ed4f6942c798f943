"""``RayExecutor`` checks its settings where it is made, and says how to get Ray when it is
missing (these tests start no Ray)."""

from __future__ import annotations

import sys

import pytest

from concurrent_loader import ConfigError
from concurrent_loader.loader.ray_workers import RayExecutor


def test_without_ray_the_executor_is_a_config_error_saying_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # as if not installed
    with pytest.raises(ConfigError, match=r"concurrent-loader\[ray\]"):
        RayExecutor()


@pytest.mark.parametrize(
    "settings",
    [
        {"actors": 0},
        {"actors": 1.5},
        {"cpus_per_actor": 0},
        {"cpus_per_actor": True},
        {"max_batches_in_flight": 0},
        {"max_attempts": 0},
    ],
)
def test_settings_out_of_range_are_refused(settings):
    with pytest.raises(ConfigError):
        RayExecutor(**settings)


def test_the_window_defaults_to_prefetch_batches_per_actor():
    pytest.importorskip("ray", reason="RayExecutor is made only where Ray is installed")
    from concurrent_loader.pipeline import PipelineOptions

    assert RayExecutor(actors=3).window(PipelineOptions(prefetch_batches=4)) == 12
    assert RayExecutor(actors=3, max_batches_in_flight=5).window(PipelineOptions()) == 5


def test_local_workers_and_actors_are_not_both_asked_for():
    pytest.importorskip("ray", reason="RayExecutor is made only where Ray is installed")
    from concurrent_loader import ConcurrentDataLoader

    with pytest.raises(ConfigError, match="num_workers"):
        ConcurrentDataLoader(list(range(8)), num_workers=2, executor=RayExecutor())


def test_an_iterable_dataset_is_not_sent_to_actors():
    pytest.importorskip("ray", reason="RayExecutor is made only where Ray is installed")
    from torch.utils.data import IterableDataset

    from concurrent_loader import ConcurrentDataLoader

    class Stream(IterableDataset[int]):
        def __iter__(self):
            return iter(range(8))

    with pytest.raises(ConfigError, match="map-style"):
        ConcurrentDataLoader(Stream(), executor=RayExecutor())
