"""Starting workers never hangs: hundreds of iterators started the way training loops start
them, under every start method.

Two loaders live in one process (training and validation, or a loader resumed from a state
while another one iterates), each with 2 workers, and iterators are created while another
is alive mid-epoch: right after the parent's event loop finished some work (a dataset made
by listing; ``ds[i]`` then ``close()``) and while it is live (``ds[i]`` kept open). A fork
copies every C library lock in the state it is in; one held by another thread of the parent
stays held in the worker forever, and the worker's first ``SSLContext`` or signature waits
on it for good.

- A hang fails within seconds, with stacks: a worker that waits ``STALL_S`` for its client
  or a batch raises ``LoaderStalled`` with every thread's stack, and torch's ``timeout``
  bounds the main process's wait (the stacks of the workers then come from py-spy).
- The cause is checked at every fork, whether or not the race is lost this time: no thread
  of the loader's runtime may have ended in Python and still be running at the OS level
  (its thread-local destructors, where OpenSSL holds its locks while it frees the thread's
  state). ``Thread.join()`` returns before that; the runtime waits for it.
"""

from __future__ import annotations

import datetime
import functools
import multiprocessing
import os
import pickle
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
import torch
from torch.utils.data import get_worker_info

from concurrent_loader import ConcurrentDataLoader, LoaderStalled, ObjectDataset
from concurrent_loader.runtime import GatedThreadPool
from concurrent_loader.stores import CredentialSource
from concurrent_loader.stores.s3.credentials import CredentialCache, CredentialSnapshot

from ._support import StoredObjects, expected_batches, sha256_hex, upload_objects

PREFIX = "worker-start/"
COUNT = 24
BATCH = 2
#: a worker waiting this long for its client or a batch raises LoaderStalled with stacks
STALL_S = 20.0
#: torch's own bound on the main process's wait for a batch (spawned workers import torch)
MAIN_TIMEOUT_S = 45
#: sequences per start method; three iterators each (fork: the cheap one, most of them)
SEQUENCES = {"fork": 96, "forkserver": 3, "spawn": 3}


@pytest.fixture(scope="module")
def objects(tmp_path_factory, s3_server, reliability_bucket) -> StoredObjects:
    """A prefix of its own, small enough that listing it is quick."""
    bodies = {f"{i:03d}.bin": os.urandom(512 + 16 * i) for i in range(COUNT)}
    root = tmp_path_factory.mktemp("worker_start")
    return upload_objects(s3_server, reliability_bucket, PREFIX, bodies, root)


class _ForkWatch:
    """At each fork of this process: which runtime threads ended in Python but still run."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.armed = False
        self.forks = 0
        self.unsafe: list[str] = []
        self._threads: list[threading.Thread] = []

    def started(self, thread: threading.Thread) -> None:
        if thread.name.startswith("concurrent-loader"):
            self._threads.append(thread)

    def before_fork(self) -> None:
        if not self.armed or os.getpid() != self.pid:
            return
        self.forks += 1
        running = []
        for thread in self._threads:
            exists = os.path.exists(f"/proc/self/task/{thread.native_id}")
            if exists and not thread.is_alive():
                self.unsafe.append(f"{thread.name} (tid {thread.native_id})")
            if exists:
                running.append(thread)
        self._threads = running


_watch = _ForkWatch()
os.register_at_fork(before=_watch.before_fork)


@pytest.fixture
def fork_watch(monkeypatch) -> Iterator[_ForkWatch]:
    start = threading.Thread.start

    def recording_start(thread: threading.Thread) -> None:
        start(thread)
        _watch.started(thread)

    monkeypatch.setattr(threading.Thread, "start", recording_start)
    _watch.forks, _watch.unsafe, _watch.armed = 0, [], True
    try:
        yield _watch
    finally:
        _watch.armed = False


def _worker_stacks() -> str:
    """py-spy dumps of this process's loader workers (the hung ones among them)."""
    py_spy = Path(sys.executable).parent / "py-spy"
    out = []
    for child in psutil.Process().children(recursive=True):
        try:
            if "weed" in child.name():
                continue
        except psutil.Error:
            continue
        if not py_spy.exists():
            out.append(f"pid {child.pid}: (py-spy not installed: no stack)")
            continue
        dump = subprocess.run(
            [str(py_spy), "dump", "--native", "--pid", str(child.pid)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        out.append(f"pid {child.pid}:\n{dump.stdout}{dump.stderr}")
    return "\n".join(out)


class _Sequences:
    """The start-up patterns, each checking that every batch holds exactly its items."""

    def __init__(self, objects: StoredObjects, context: str) -> None:
        self.objects = objects
        self.context = context
        self.keys = objects.keys
        self.iterators = 0
        self.validation = [list(range(i, i + BATCH)) for i in range(0, COUNT, BATCH)]
        # Made once: only the patterns that are about a new dataset make one.
        self.train_ds, self.val_ds = self.dataset(), self.dataset()

    def dataset(self, listed: bool = False) -> ObjectDataset:
        keys = None if listed else self.keys
        return ObjectDataset(self.objects.url, keys, decode=sha256_hex)

    def loader(self, dataset: ObjectDataset, seed: int | None = None) -> ConcurrentDataLoader:
        shuffle = {}
        if seed is not None:
            shuffle = {"shuffle": True, "generator": torch.Generator().manual_seed(seed)}
        return ConcurrentDataLoader(
            dataset,
            batch_size=BATCH,
            num_workers=2,
            multiprocessing_context=self.context,
            stall_timeout_s=STALL_S,
            timeout=MAIN_TIMEOUT_S,
            **shuffle,
        )

    def check(self, batch: Any, indices: list[int], what: str) -> None:
        want = [self.objects.digests[i] for i in indices]
        assert list(batch) == want, f"{what}: batch holds the wrong items"

    def start(self, make: Callable[[], Iterator[Any]], indices: list[int], what: str) -> Any:
        """``iter()``, then its first batch: where a hung worker shows."""
        self.iterators += 1
        started = time.monotonic()
        iterator = make()
        try:
            batch = next(iterator)
        except LoaderStalled as exc:
            pytest.fail(f"{self.context} {what}: a worker hung at start:\n{exc}")
        except RuntimeError as exc:
            if "timed out" not in str(exc):
                raise
            pytest.fail(
                f"{self.context} {what}: no first batch in {time.monotonic() - started:.0f} s"
                f" ({exc}); the workers:\n{_worker_stacks()}"
            )
        self.check(batch, indices, what)
        return iterator

    def run(self, number: int) -> None:
        kind = number % 4
        seed = 1000 + number
        expected = expected_batches(COUNT, BATCH, seed)
        val = self.validation
        if kind == 0:  # validation in the middle of a training epoch, twice
            train, valid = self.loader(self.train_ds, seed), self.loader(self.val_ds)
            it_train = self.start(lambda: iter(train), expected[0], "train")
            self.check(next(it_train), expected[1], "train batch 1")
            it_val = self.start(lambda: iter(valid), val[0], "validation")
            self.check(next(it_val), val[1], "validation batch 1")
            del it_val
            self.check(next(it_train), expected[2], "train batch 2")
            it_val = self.start(lambda: iter(valid), val[0], "validation again")
            del it_val, it_train
        elif kind == 1:  # resume, into a dataset listed just now, while another iterates
            train = self.loader(self.train_ds, seed)
            other = self.start(lambda: iter(self.loader(self.val_ds)), val[0], "other")
            it_train = self.start(lambda: iter(train), expected[0], "before resume")
            self.check(next(it_train), expected[1], "before resume batch 1")
            state = train.state_dict()
            resumed = self.loader(self.dataset(listed=True), seed)
            resumed.load_state_dict(state)
            it_resumed = self.start(lambda: iter(resumed), expected[2], "resumed")
            del it_train, it_resumed, other
        elif kind == 2:  # break early and restart, just after a fetch in this process
            train, valid = self.loader(self.train_ds, seed), self.loader(self.val_ds)
            it_val = self.start(lambda: iter(valid), val[0], "validation")
            it_train = self.start(lambda: iter(train), expected[0], "first")
            del it_train  # break
            # The restart draws the next epoch from the generator where it is now.
            again = expected_batches_from(train.generator)
            # ds[i] starts this process's event loop; close() ends it just before the fork.
            self.check([self.val_ds[0]], [0], "ds[0] in the main process")
            self.val_ds.close()
            it_train = self.start(lambda: iter(train), again[0], "restarted")
            del it_train, it_val
        else:  # the main process's event loop live (ds[i] kept open) while workers start
            dataset = self.train_ds
            self.check([dataset[1]], [1], "ds[1] in the main process")
            train, valid = self.loader(dataset, seed), self.loader(dataset)
            it_train = self.start(lambda: iter(train), expected[0], "train, live loop")
            self.check([dataset[2]], [2], "ds[2] while workers run")
            it_val = self.start(lambda: iter(valid), val[0], "validation, live loop")
            self.check(next(it_train), expected[1], "train batch 1, live loop")
            del it_val
            it_val = self.start(lambda: iter(valid), val[0], "validation again, live loop")
            del it_val, it_train
            dataset.close()


def expected_batches_from(generator: torch.Generator) -> list[list[int]]:
    """The batches a shuffled loader draws next from ``generator`` (left as it is): as torch,
    the workers' base seed first, then the permutation."""
    copy = torch.Generator()
    copy.set_state(generator.get_state())
    torch.empty((), dtype=torch.int64).random_(generator=copy)
    permutation = torch.randperm(COUNT, generator=copy).tolist()
    return [permutation[i : i + BATCH] for i in range(0, COUNT, BATCH)]


@pytest.mark.stress
@pytest.mark.timeout(240)
@pytest.mark.parametrize("context", ["fork", "forkserver", "spawn"])
def test_workers_start_without_hanging(objects, s3_env, fork_watch, context):
    if context not in torch.multiprocessing.get_all_start_methods():
        pytest.skip(f"no {context} start method here")
    sequences = _Sequences(objects, context)
    started = time.monotonic()
    for number in range(SEQUENCES[context]):
        sequences.run(number)
    elapsed = time.monotonic() - started
    print(
        f"{context}: {sequences.iterators} iterators in {elapsed:.0f} s, "
        f"{fork_watch.forks} forks of this process"
    )
    assert sequences.iterators >= 3 * SEQUENCES[context]
    if context == "fork" and os.path.isdir("/proc/self/task"):
        assert fork_watch.forks >= 2 * sequences.iterators
        assert not fork_watch.unsafe, (
            f"{len(fork_watch.unsafe)} of {fork_watch.forks} forks happened while a runtime "
            f"thread was still ending (holding C library locks): {fork_watch.unsafe[:5]}"
        )


# ---------------------------------------------------------------------------- what a worker gets


def _has_snapshot(dataset: ObjectDataset, answer: Any) -> None:
    answer.send(dataset.store.credentials.snapshot is not None)


def test_workers_get_the_main_process_credentials_and_nobody_else_does(objects, s3_server, s3_env):
    dataset = ObjectDataset(objects.url, objects.keys)
    snapshot = dataset.store.credentials.snapshot
    assert snapshot is not None and snapshot.expires_at is None  # static keys, from env
    assert s3_server.secret_key not in repr(dataset.store)
    # A pickle of the dataset (to disk, say) leaves the keys out...
    pickled = pickle.dumps(dataset)
    assert s3_server.secret_key.encode() not in pickled
    assert pickle.loads(pickled).store.credentials.snapshot is None
    # ...a worker process being started receives them.
    receive, send = multiprocessing.get_context("spawn").Pipe(duplex=False)
    child = multiprocessing.get_context("spawn").Process(target=_has_snapshot, args=(dataset, send))
    child.start()
    try:
        assert receive.poll(60) and receive.recv() is True
    finally:
        child.join(30)
        receive.close()
        send.close()


def test_a_fresh_snapshot_is_signed_with_without_botocore(monkeypatch):
    def no_botocore(self: CredentialSource) -> Any:
        raise AssertionError("a worker made a botocore session")

    monkeypatch.setattr(CredentialSource, "botocore_session", no_botocore)
    in_an_hour = time.time() + 3600
    source = CredentialSource(snapshot=CredentialSnapshot("AKID", "secret", "token", in_an_hour))
    frozen = CredentialCache(source, "s3://b/").get()
    assert (frozen.access_key, frozen.secret_key, frozen.token) == ("AKID", "secret", "token")


def test_a_snapshot_near_expiry_is_refreshed_by_the_workers_own_chain(monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIDFROMCHAIN")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secretfromchain")
    monkeypatch.delenv("AWS_SESSION_TOKEN", raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", os.devnull)
    in_five_minutes = time.time() + 300  # inside botocore's advisory refresh window
    source = CredentialSource(snapshot=CredentialSnapshot("AKIDOLD", "old", "t", in_five_minutes))
    assert CredentialCache(source, "s3://b/").get().access_key == "AKIDFROMCHAIN"


def test_refreshable_credentials_are_snapshotted_with_their_expiry():
    from botocore.credentials import RefreshableCredentials

    expiry = datetime.datetime.now(datetime.UTC) + datetime.timedelta(hours=1)
    refreshable = RefreshableCredentials(
        "AKIDROLE", "rolesecret", "roletoken", expiry, lambda: {}, "assume-role"
    )

    class Session:
        def get_credentials(self) -> Any:
            return refreshable

    snapshot = CredentialSource().resolved(Session()).snapshot
    assert snapshot is not None
    assert (snapshot.access_key, snapshot.token) == ("AKIDROLE", "roletoken")
    assert snapshot.expires_at == pytest.approx(expiry.timestamp())


def _snapshot_key(expected: str, answer: Any, worker_id: int) -> None:
    snapshot = get_worker_info().dataset.store.credentials.snapshot
    answer.send(snapshot is not None and snapshot.access_key == expected)


def test_a_snapshot_near_expiry_is_refreshed_once_before_workers_start(objects, s3_server, s3_env):
    dataset = ObjectDataset(objects.url, objects.keys[:4])
    credentials = dataset.store.credentials
    # As if resolved from a role hours ago: within botocore's refresh window now.
    stale = CredentialSnapshot("AKIDSTALE", "stale", "token", time.time() + 300)
    object.__setattr__(credentials, "snapshot", stale)
    receive, send = multiprocessing.Pipe(duplex=False)
    loader = ConcurrentDataLoader(
        dataset,
        batch_size=2,
        num_workers=1,
        multiprocessing_context="fork",
        worker_init_fn=functools.partial(_snapshot_key, s3_server.access_key, send),
    )
    try:
        assert len(list(loader)) == 2
        # The worker started with the main process's fresh snapshot (its chain never built).
        assert receive.poll(30) and receive.recv() is True
    finally:
        receive.close()
        send.close()
    assert credentials.snapshot is not stale
    assert credentials.snapshot.access_key == s3_server.access_key


def test_the_snapshot_of_an_s3_store_inside_a_cache_is_refreshed_too(objects, s3_env, tmp_path):
    from concurrent_loader.loader.starting import fresh_credentials

    dataset = ObjectDataset(objects.url, objects.keys[:4], cache=str(tmp_path / "cache"))
    credentials = dataset.store.inner.credentials  # the S3 store's, under the cache
    stale = CredentialSnapshot("AKIDSTALE", "stale", "token", time.time() + 300)
    object.__setattr__(credentials, "snapshot", stale)
    fresh_credentials(dataset)
    assert credentials.snapshot is not stale


def test_a_usable_snapshot_is_left_as_it_is(monkeypatch):
    def no_botocore(self: CredentialSource) -> Any:
        raise AssertionError("resolved again")

    monkeypatch.setattr(CredentialSource, "botocore_session", no_botocore)
    snapshot = CredentialSnapshot("AKID", "secret", "token", time.time() + 3600)
    source = CredentialSource(snapshot=snapshot)
    source.refresh_snapshot()
    assert source.snapshot is snapshot


def test_a_fork_waits_for_the_jobs_of_a_gated_pool():
    # A main-process pipeline's decode or __getitem__ job (user code, maybe inside OpenSSL)
    # is not forked in the middle: the fork waits for it, and a job submitted meanwhile
    # starts after the fork.
    pool = GatedThreadPool(2, "concurrent-loader-test")
    started = threading.Event()
    ended: list[float] = []

    def job(seconds: float) -> None:
        started.set()
        time.sleep(seconds)
        ended.append(time.monotonic())

    try:
        first = pool.submit(job, 0.3)
        assert started.wait(5)
        pid = os.fork()
        if pid == 0:
            os._exit(0)
        forked = time.monotonic()
        os.waitpid(pid, 0)
        first.result(5)
        assert ended and ended[0] <= forked
    finally:
        pool.shutdown()
    # The pool no longer counts once shut down: a later fork does not look at it.
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
