"""One local Ray cluster for every test here, started on loopback only: these tests run
in a loopback-only network namespace (``tests/executors/test_ray_namespace.py`` starts
them there), where Ray can reach nothing else and nothing else can reach it."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.helpers import no_loader_threads_left

__all__ = ["no_loader_threads_left", "ray_cluster"]

CLUSTER_CPUS = 4


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[Any]:
    import ray

    ray.init(num_cpus=CLUSTER_CPUS, include_dashboard=False, _node_ip_address="127.0.0.1")
    try:
        yield ray
    finally:
        ray.shutdown()
