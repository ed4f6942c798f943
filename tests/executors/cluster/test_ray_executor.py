"""``ConcurrentDataLoader(executor=RayExecutor(...))`` on a real local Ray cluster keeps every
promise of the local loader: the sampler's batches in order, each sample once per epoch
(also when an actor is killed mid-epoch), exact resume across executors, errors with their
type and object, the skip policy, merged stats, at most ``max_batches_in_flight`` batches
in flight, and no actor left behind."""

from __future__ import annotations

import gc
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from concurrent_loader import ConcurrentDataLoader, ObjectDataset, ObjectNotFound, WorkerError
from concurrent_loader.cache import CacheConfig
from concurrent_loader.loader.ray_workers import RayExecutor
from concurrent_loader.stores import HttpConfig
from concurrent_loader.testing.files import FileServer
from tests.executors.cluster.workload import (
    SlowIndex,
    StartLog,
    fail_to_start,
    index_of,
    write_numbered,
)
from tests.helpers import key_for

COUNT = 60
BATCH = 4


@pytest.fixture(scope="module")
def numbered(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_numbered(tmp_path_factory.mktemp("numbered"), COUNT)


def loader(dataset: Any, seed: int = 5, **kwargs: Any) -> ConcurrentDataLoader[Any]:
    return ConcurrentDataLoader(
        dataset,
        batch_size=BATCH,
        shuffle=True,
        generator=torch.Generator().manual_seed(seed),
        collate_fn=list,
        **kwargs,
    )


def on_ray(**options: Any) -> RayExecutor:
    return RayExecutor(**({"actors": 2, "cpus_per_actor": 0.5} | options))


def epochs(dataset: Any, count: int) -> list[list[Any]]:
    """``count`` epochs of the local loader (no workers): what every executor must give."""
    local = loader(dataset)
    return [list(local) for _ in range(count)]


def actors_of(remote: ConcurrentDataLoader[Any]) -> list[Any]:
    assert remote._ray_workers is not None
    return remote._ray_workers.actors


def alive(ray: Any, handle: Any) -> bool:
    try:
        ray.get(handle.pid.remote(), timeout=60)
    except ray.exceptions.RayActorError:
        return False
    return True


def ends(ray: Any, handle: Any, within_s: float = 30.0) -> bool:
    """Whether the actor stops answering within ``within_s`` (``ray.kill`` takes effect
    asynchronously: a call sent just after it may still be answered)."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if not alive(ray, handle):
            return True
        time.sleep(0.2)
    return False


def test_batches_are_the_samplers_in_order_each_sample_once(ray_cluster, numbered):
    dataset = ObjectDataset(str(numbered), decode=index_of)
    expected = epochs(dataset, 2)
    remote = loader(dataset, executor=on_ray())
    try:
        for epoch in range(2):
            got = list(remote)
            assert got == expected[epoch]
            assert sorted(i for batch in got for i in batch) == list(range(COUNT))
        stats = remote.stats()
        assert stats["batches"] == sum(map(len, expected))
        assert stats["bytes"] == 2 * sum(p.stat().st_size for p in numbered.iterdir())
    finally:
        remote.close()


def test_resume_across_executors_is_exact(ray_cluster, numbered):
    dataset = ObjectDataset(str(numbered), decode=index_of)
    expected = epochs(dataset, 3)
    local = loader(dataset)
    list(local)
    batches = iter(local)
    head = [next(batches) for _ in range(3)]
    remote = loader(dataset, seed=99, executor=on_ray(actors=1))
    try:
        remote.load_state_dict(local.state_dict())  # taken with local workers
        assert head + list(remote) == expected[1]
        batches = iter(remote)
        head = [next(batches) for _ in range(2)]
        state = remote.state_dict()  # taken with actors
    finally:
        remote.close()
    again = loader(dataset, seed=123)
    again.load_state_dict(state)
    assert head + list(again) == expected[2]


def test_errors_keep_their_type_and_object_and_the_epoch_goes_on(ray_cluster, tmp_path):
    # Over HTTP from the project's file server: the actor's remote path (its event loop,
    # fetch client and connections), and a 404 for the missing object.
    root = write_numbered(tmp_path / "data", 12)
    (root / key_for(5)).unlink()
    with FileServer(root) as server:
        url = server.endpoint_url + "/"
        keys = [key_for(i) for i in range(12)]
        dataset = ObjectDataset(HttpConfig.from_url(url), keys=keys, decode=index_of)
        remote = ConcurrentDataLoader(
            dataset, batch_size=BATCH, collate_fn=list, executor=on_ray(actors=1)
        )
        try:
            batches = iter(remote)
            assert next(batches) == [0, 1, 2, 3]
            with pytest.raises(ObjectNotFound) as raised:
                next(batches)
            assert raised.value.url == url + key_for(5)
            assert next(batches) == [8, 9, 10, 11]
            assert remote.stats()["requests"] >= 2 * BATCH  # the two whole batches, at least
        finally:
            remote.close()


def test_actors_keep_and_share_the_node_cache_across_epochs(ray_cluster, numbered, tmp_path):
    # Two actors, one on each simulated node; both nodes are this machine, so they share one
    # cache directory, as the actors of one real node do. The first epoch fills it (every
    # read a miss); in the second every read is a hit, whichever actor makes the batch.
    with FileServer(numbered) as server:
        url = server.endpoint_url + "/"
        keys = [key_for(i) for i in range(COUNT)]
        cache = CacheConfig(str(tmp_path / "cache"), max_bytes=10**8)
        dataset = ObjectDataset(HttpConfig.from_url(url), keys=keys, decode=index_of, cache=cache)
        remote = loader(dataset, executor=on_ray())
        try:
            seen = []
            for _ in range(2):
                got = list(remote)
                assert sorted(i for batch in got for i in batch) == list(range(COUNT))
                stats = remote.stats()
                seen.append((stats["cache_hits"], stats["cache_misses"]))
        finally:
            remote.close()
    assert seen[0] == (0, COUNT)
    assert seen[1] == (COUNT, COUNT)  # the second epoch: COUNT hits, no new miss


def test_an_actor_that_cannot_start_is_a_worker_error_naming_why(ray_cluster, numbered):
    dataset = ObjectDataset(str(numbered), decode=index_of)
    remote = loader(dataset, worker_init_fn=fail_to_start, executor=on_ray(actors=1))
    try:
        with pytest.raises(WorkerError, match="no scratch disk"):
            next(iter(remote))
    finally:
        remote.close()


def test_the_skip_policy_marks_the_batch_that_lost_a_sample(ray_cluster, tmp_path):
    root = write_numbered(tmp_path / "data", 12)
    dataset = ObjectDataset(str(root), decode=index_of)
    (root / "00006.bin").unlink()
    remote = ConcurrentDataLoader(
        dataset,
        batch_size=BATCH,
        collate_fn=list,
        on_error="skip",
        max_skipped=1,
        executor=on_ray(actors=1),
    )
    try:
        got = list(remote)
        assert got == [[0, 1, 2, 3], [4, 5, 7], [8, 9, 10, 11]]
        [skipped] = got[1].skipped
        assert skipped.index == 6 and skipped.url.endswith("00006.bin")
        assert remote.stats()["skipped"] == 1
    finally:
        remote.close()


def test_no_more_than_max_batches_in_flight_are_started(ray_cluster, tmp_path):
    window = 3
    dataset = StartLog(40, tmp_path / "started.log")
    remote = ConcurrentDataLoader(
        dataset,
        batch_size=BATCH,
        collate_fn=list,
        executor=on_ray(actors=1, max_batches_in_flight=window),
    )
    try:
        for number, batch in enumerate(remote):
            assert batch == list(range(number * BATCH, (number + 1) * BATCH))
            if number in (0, 4):
                time.sleep(1.0)  # time for the actors to start anything they were sent
                started = dataset.started()
                # Batches number .. number + window - 1 may be out; none after them.
                assert max(started) < (number + window) * BATCH
                assert max(started) >= (number + 1) * BATCH  # the window does fill
    finally:
        remote.close()


def test_close_and_garbage_collection_leave_no_actor(ray_cluster, numbered):
    ray = ray_cluster.ray
    dataset = ObjectDataset(str(numbered), decode=index_of)
    closed = loader(dataset, executor=on_ray(actors=1))
    for _ in closed:
        break  # an epoch left early: the actors stay for the next one
    handles = actors_of(closed)
    assert all(alive(ray, handle) for handle in handles)
    closed.close()
    assert all(ends(ray, handle) for handle in handles)

    dropped = loader(dataset, executor=on_ray(actors=1))
    next(iter(dropped))
    handles = actors_of(dropped)
    del dropped
    gc.collect()
    assert all(ends(ray, handle) for handle in handles)
    assert ray.is_initialized()  # a Ray the loader did not start stays up


# Last: the worker node it takes away is not replaced.
def test_an_actor_killed_or_its_node_gone_mid_epoch_loses_no_batch_and_repeats_none(
    ray_cluster, numbered
):
    ray = ray_cluster.ray
    expected = epochs(ObjectDataset(str(numbered), decode=index_of), 2)
    slow = ObjectDataset(str(numbered), decode=SlowIndex(0.02))
    # One actor per node (actors are spread over the nodes).
    remote = loader(slow, executor=on_ray(cpus_per_actor=1, max_batches_in_flight=4))
    try:
        batches = iter(remote)
        got = [next(batches), next(batches)]
        victim = actors_of(remote)[0]
        ray.kill(victim)
        got += list(batches)
        assert got == expected[0]
        assert ends(ray, victim)
        pair = actors_of(remote)
        assert len(pair) == 2 and victim not in pair  # replaced

        batches = iter(remote)
        got = [next(batches), next(batches)]
        ray_cluster.node_leaves()
        got += list(batches)
        assert got == expected[1]
        assert len(set(pair) - set(actors_of(remote))) == 1  # the node's actor, replaced
    finally:
        remote.close()
