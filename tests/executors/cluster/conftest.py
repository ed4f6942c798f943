"""One local Ray cluster of two nodes (a head and a worker node, simulated on this machine by
``ray.cluster_utils.Cluster``) for every test here, started on loopback only: these tests
run in a loopback-only network namespace (``tests/executors/test_ray_namespace.py`` starts
them there), where Ray can reach nothing else and nothing else can reach it."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from tests.helpers import no_loader_threads_left

__all__ = ["RayCluster", "no_loader_threads_left", "ray_cluster"]

CPUS_PER_NODE = 2


@dataclass
class RayCluster:
    """The session's cluster: ``ray`` (connected to it) and its worker node."""

    ray: Any
    cluster: Any
    worker_node: Any

    def node_leaves(self) -> None:
        """The worker node goes, with its actors and the objects it holds (for good: the
        head alone runs what follows)."""
        self.cluster.remove_node(self.worker_node)

    def _add_node(self) -> Any:
        node = self.cluster.add_node(num_cpus=CPUS_PER_NODE, node_ip_address="127.0.0.1")
        self.cluster.wait_for_nodes()
        return node


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[RayCluster]:
    import ray
    from ray.cluster_utils import Cluster

    head = {"num_cpus": CPUS_PER_NODE, "node_ip_address": "127.0.0.1"}
    cluster = Cluster(initialize_head=True, head_node_args=head | {"include_dashboard": False})
    try:
        session = RayCluster(ray, cluster, None)
        session.worker_node = session._add_node()
        ray.init(address=cluster.address)
        try:
            yield session
        finally:
            ray.shutdown()
    finally:
        cluster.shutdown()
