"""Every way a training loop stops leaves nothing behind, quickly.

Each test reads through a proxy with 100 ms of latency so that GETs are really in flight
when the loop stops, then checks that no thread, child process or TCP socket that the
loader created is left in the test process, within a couple of seconds. Paths that end
the interpreter (Ctrl-C, the end of a script) run in a child Python process.
"""

from __future__ import annotations

import json
import os
import selectors
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest
from torch.utils.data._utils import MP_STATUS_CHECK_INTERVAL

from concurrent_loader import (
    ConcurrentDataLoader,
    ConfigError,
    FetchConfig,
    ObjectDataset,
    ObjectNotFound,
    WorkerError,
    runtime,
)
from concurrent_loader.stores import S3Config

from ._support import Resources, child_pids, repo_root, sha256_hex, wait_until

LATENCY_MS = 100
COUNT = 256
# "At most a couple of seconds", with some room for a loaded machine.
SHUTDOWN_S = 2.5
# Exiting after Ctrl-C normally takes about half a second; when it went wrong, a fallback
# timeout ran out: torch's wait for a worker before terminating it, or the runtime's wait for
# its threads. A bound under both fails on either, with room for a loaded 2-core machine.
INTERRUPT_S = 0.8 * min(MP_STATUS_CHECK_INTERVAL, runtime.QUIESCE_TIMEOUT_S)


class TrainingStepError(Exception):
    """Raised by the test's training step."""


@pytest.fixture
def slow_proxy(proxy_factory):
    return proxy_factory(latency_ms=LATENCY_MS)


def _dataset(small_objects, proxy, **kwargs):
    return ObjectDataset(
        S3Config.from_url(small_objects.url, endpoint_url=proxy.endpoint_url),
        small_objects.keys[:COUNT],
        decode=sha256_hex,
        fetch_config=FetchConfig(max_inflight_requests=16),
        **kwargs,
    )


def _loader(ds, num_workers):
    return ConcurrentDataLoader(ds, batch_size=8, num_workers=num_workers, prefetch_batches=4)


def _wait_for_inflight(proxy):
    """Block until the proxy holds at least one GET: the loader is mid-request."""
    assert wait_until(lambda: proxy.stats()["inflight"] > 0, timeout=5), "no GET in flight"


def _assert_clean(before: Resources, stopped_at: float) -> None:
    took, left = before.wait_clean(timeout=5)
    assert not left, f"left behind after {took:.1f} s: {left}"
    total = time.monotonic() - stopped_at
    assert total < SHUTDOWN_S, f"shutting down took {total:.1f} s"


# ---------------------------------------------------------------------------- in process


@pytest.mark.parametrize("num_workers", [0, 2])
def test_break_out_of_the_loop(small_objects, s3_env, slow_proxy, num_workers):
    before = Resources.now()
    loader = _loader(_dataset(small_objects, slow_proxy), num_workers)
    batches = 0
    for _batch in loader:
        batches += 1
        _wait_for_inflight(slow_proxy)
        stopped_at = time.monotonic()
        break
    assert batches == 1
    _assert_clean(before, stopped_at)
    # The loader itself stays usable: a new epoch starts from scratch.
    assert len(next(iter(loader))) == 8
    _assert_clean(before, time.monotonic())


@pytest.mark.parametrize("num_workers", [0, 2])
def test_exception_in_the_training_step(small_objects, s3_env, slow_proxy, num_workers):
    before = Resources.now()
    loader = _loader(_dataset(small_objects, slow_proxy), num_workers)
    stopped_at = 0.0

    def train():
        nonlocal stopped_at
        for _batch in loader:
            _wait_for_inflight(slow_proxy)
            stopped_at = time.monotonic()
            raise TrainingStepError("loss is NaN")

    with pytest.raises(TrainingStepError) as info:
        train()
    # ``info`` keeps the traceback (and train's frame) alive, as a logging handler would.
    _assert_clean(before, stopped_at)
    assert info.value.args == ("loss is NaN",)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_del_loader_and_iterator(small_objects, s3_env, slow_proxy, num_workers):
    before = Resources.now()
    loader = _loader(_dataset(small_objects, slow_proxy), num_workers)
    iterator = iter(loader)
    next(iterator)
    _wait_for_inflight(slow_proxy)
    stopped_at = time.monotonic()
    del iterator, loader
    _assert_clean(before, stopped_at)


@pytest.mark.parametrize(
    "failure",
    [
        # Raised by a worker's pipeline while fetching (a missing object).
        "fetch",
        # Raised by a worker while it opens its reader (a malformed endpoint).
        "open",
    ],
)
def test_error_raised_in_a_worker(small_objects, s3_env, slow_proxy, failure):
    before = Resources.now()
    if failure == "fetch":
        keys = [*small_objects.keys[:15], "no/such/object.bin"]
        ds = ObjectDataset(
            S3Config.from_url(small_objects.url, endpoint_url=slow_proxy.endpoint_url), keys
        )
        expected: type[Exception] = ObjectNotFound
    else:
        ds = _dataset(small_objects, slow_proxy)
        # A store config that passed validation but fails when a worker opens it.
        object.__setattr__(ds.store, "endpoint_url", "ftp://127.0.0.1:1/")
        object.__setattr__(ds.store, "route", None)  # so the worker resolves it
        expected = ConfigError
    with pytest.raises(expected) as info:
        for _batch in _loader(ds, num_workers=2):
            pass
    stopped_at = time.monotonic()
    # The caller still holds the error (and its traceback), as a logging handler would.
    _assert_clean(before, stopped_at)
    assert isinstance(info.value, expected)


def test_worker_killed_by_the_os_is_an_error_not_a_hang(small_objects, s3_env, slow_proxy):
    before = Resources.now()
    loader = _loader(_dataset(small_objects, slow_proxy), num_workers=2)
    iterator = iter(loader)
    next(iterator)
    workers = sorted(child_pids() - before.children)
    assert len(workers) == 2, workers
    _wait_for_inflight(slow_proxy)
    # Inside the block: torch reports the death from its SIGCHLD handler, which may run
    # as soon as the kill returns.
    with pytest.raises((RuntimeError, WorkerError)) as info:
        os.kill(workers[0], signal.SIGKILL)
        killed_at = time.monotonic()
        for _batch in iterator:
            pass
    detected = time.monotonic() - killed_at
    assert detected < 10, f"the dead worker was noticed after {detected:.1f} s"
    message = str(info.value)
    assert "exited unexpectedly" in message or "killed" in message, message
    assert str(workers[0]) in message
    stopped_at = time.monotonic()
    del iterator, loader
    _assert_clean(before, stopped_at)


# ---------------------------------------------------------------------------- child scripts

CHILD = textwrap.dedent(
    """
    import json, os, sys, time

    import psutil

    from concurrent_loader import ConcurrentDataLoader, FetchConfig, ObjectDataset
    from concurrent_loader.stores import S3Config

    config = json.loads(sys.argv[1])
    ds = ObjectDataset(
        S3Config.from_url(config["url"], endpoint_url=config["endpoint"]),
        config["keys"],
        fetch_config=FetchConfig(max_inflight_requests=16),
    )
    loader = ConcurrentDataLoader(
        ds,
        batch_size=8,
        num_workers=config["num_workers"],
        prefetch_batches=4,
        persistent_workers=config["mode"] == "between",
    )


    def ready():
        children = [p.pid for p in psutil.Process().children(recursive=True)]
        print(json.dumps({"children": children}), flush=True)


    if config["mode"] == "loop":
        # Iterate for ever (epoch after epoch) until interrupted.
        announced = False
        while True:
            for batch in loader:
                if not announced:
                    ready()
                    announced = True
                time.sleep(0.01)
    elif config["mode"] == "between":
        # One epoch, then idle: the persistent workers hold the next epoch's first batches.
        for batch in loader:
            pass
        ready()
        while True:
            time.sleep(0.01)
    elif config["mode"] == "exit":
        for batch in loader:
            ready()
            time.sleep(config["pause"])
            sys.exit(0)
    else:  # "end": the script ends with an iterator in flight, held by a global
        iterator = iter(loader)
        next(iterator)
        ready()
        time.sleep(config["pause"])
    """
)


def _start_child(tmp_path, small_objects, proxy, num_workers, mode):
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    config = {
        "url": small_objects.url,
        "keys": small_objects.keys[:COUNT],
        "endpoint": proxy.endpoint_url,
        "num_workers": num_workers,
        "mode": mode,
        # Long enough after announcing itself for the next GETs to be in flight.
        "pause": LATENCY_MS / 1000 / 2,
    }
    env = dict(os.environ, PYTHONPATH=repo_root(), PYTHONUNBUFFERED="1")
    return subprocess.Popen(
        [sys.executable, str(script), json.dumps(config)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        cwd=tmp_path,
        start_new_session=True,  # its own process group, as a shell job would be
    )


def _read_ready_line(child, timeout: float = 60) -> dict:
    with selectors.DefaultSelector() as selector:
        selector.register(child.stdout, selectors.EVENT_READ)
        if not selector.select(timeout):
            child.kill()
            _, err = child.communicate()
            pytest.fail(f"the child did not start within {timeout} s:\n{err.decode()[-3000:]}")
    line = child.stdout.readline()
    if not line:
        _, err = child.communicate()
        pytest.fail(f"the child exited early ({child.returncode}):\n{err.decode()[-3000:]}")
    return json.loads(line)


def _assert_gone(pids: list[int], timeout: float = 3.0) -> None:
    def alive() -> list[int]:
        found = []
        for pid in pids:
            try:
                if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                    found.append(pid)
            except psutil.NoSuchProcess:
                pass
        return found

    wait_until(lambda: not alive(), timeout)
    assert not alive(), f"processes outlived their parent: {alive()}"


@pytest.mark.parametrize("num_workers, target", [(0, "process"), (2, "process"), (2, "group")])
def test_keyboard_interrupt(tmp_path, small_objects, s3_env, slow_proxy, num_workers, target):
    child = _start_child(tmp_path, small_objects, slow_proxy, num_workers, "loop")
    try:
        ready = _read_ready_line(child)
        assert len(ready["children"]) == num_workers
        _wait_for_inflight(slow_proxy)
        interrupted_at = time.monotonic()
        if target == "group":  # Ctrl-C in a terminal reaches the whole process group
            os.killpg(child.pid, signal.SIGINT)
        else:
            child.send_signal(signal.SIGINT)
        _, err = child.communicate(timeout=30)
        took = time.monotonic() - interrupted_at
    finally:
        if child.poll() is None:
            child.kill()
            child.communicate()
    stderr = err.decode(errors="replace")
    assert child.returncode == -signal.SIGINT, (child.returncode, stderr[-3000:])
    assert "KeyboardInterrupt" in stderr
    assert took < INTERRUPT_S, f"exiting after Ctrl-C took {took:.1f} s"
    assert "Exception ignored" not in stderr, stderr[-3000:]
    _assert_gone(ready["children"])


def test_keyboard_interrupt_between_epochs_with_persistent_workers(
    tmp_path, small_objects, s3_env, slow_proxy
):
    child = _start_child(tmp_path, small_objects, slow_proxy, 2, "between")
    try:
        ready = _read_ready_line(child)
        assert len(ready["children"]) == 2
        interrupted_at = time.monotonic()
        os.killpg(child.pid, signal.SIGINT)
        _, err = child.communicate(timeout=30)
        took = time.monotonic() - interrupted_at
    finally:
        if child.poll() is None:
            child.kill()
            child.communicate()
    stderr = err.decode(errors="replace")
    assert child.returncode == -signal.SIGINT, (child.returncode, stderr[-3000:])
    assert took < INTERRUPT_S, f"exiting after Ctrl-C took {took:.1f} s"
    assert "Exception ignored" not in stderr, stderr[-3000:]
    _assert_gone(ready["children"])


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("mode", ["exit", "end"])
def test_end_of_the_interpreter_mid_iteration(
    tmp_path, small_objects, s3_env, slow_proxy, num_workers, mode
):
    child = _start_child(tmp_path, small_objects, slow_proxy, num_workers, mode)
    try:
        ready = _read_ready_line(child)
        assert len(ready["children"]) == num_workers
        ready_at = time.monotonic()
        _, err = child.communicate(timeout=30)
        took = time.monotonic() - ready_at
    finally:
        if child.poll() is None:
            child.kill()
            child.communicate()
    stderr = err.decode(errors="replace")
    assert child.returncode == 0, (child.returncode, stderr[-3000:])
    assert stderr.strip() == "", stderr[-3000:]
    # The script sleeps 50 ms after it announces itself; the rest is the shutdown.
    assert took < SHUTDOWN_S, f"the interpreter took {took:.1f} s to exit"
    _assert_gone(ready["children"])
