"""A worker process killed by the OS (SIGKILL, as the out-of-memory killer sends it) is a
``WorkerError`` naming its pid and signal, in every epoch, with or without persistent
workers, under every start method; once it is raised, no worker of that epoch is left
running or unreaped; and the loader's next epoch starts new workers and yields every batch.

A worker kills itself at a controlled point (as it starts, while decoding a given sample)
after a short delay, so that the main process is waiting inside the loader when the worker
dies. torch reports a death from its SIGCHLD handler, in whatever the main process runs at
that moment: a death while the training loop's own code runs reaches that code as torch's
``RuntimeError``, which no loader can translate (the last test).
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from concurrent_loader import ConcurrentDataLoader, ObjectDataset, WorkerError
from concurrent_loader.testing.memory import MemoryConfig

COUNT = 32
BATCH = 4
EXPECTED = [list(range(i, i + BATCH)) for i in range(0, COUNT, BATCH)]
LATENCY_S = 0.02
#: how long a dying worker waits before its death: the main process is waiting by then
DELAY_S = 0.5


def _body(index: int) -> bytes:
    return f"{index:06d}".encode().ljust(64, b".")


class _Kill:
    """Kill this process with SIGKILL after ``DELAY_S``, once across every process: the first
    one to take the file ``armed`` away, which first writes its pid next to it."""

    def __init__(self, armed: Path) -> None:
        self.armed = armed
        armed.touch()

    @property
    def killed_pid(self) -> int:
        return int(self.armed.with_suffix(".pid").read_text())

    def __call__(self) -> None:
        try:
            self.armed.unlink()
        except FileNotFoundError:
            return
        self.armed.with_suffix(".pid").write_text(str(os.getpid()))
        time.sleep(DELAY_S)
        os.kill(os.getpid(), signal.SIGKILL)


class KilledAtStart:
    """A ``worker_init_fn``: worker 0 dies as it starts, before the loader's code runs in it."""

    def __init__(self, kill: _Kill) -> None:
        self.kill = kill

    def __call__(self, worker_id: int) -> None:
        if worker_id == 0:
            self.kill()


class KilledWhileDecoding:
    """A decode: the process decoding sample ``index`` for the ``nth`` time dies."""

    def __init__(self, kill: _Kill, index: int, nth: int = 1) -> None:
        self.kill = kill
        self.index = index
        self.nth = nth
        self.decoded = 0  # in this process: a persistent worker counts across epochs

    def __call__(self, data: bytes | bytearray) -> int:
        index = int(bytes(data[:6]))
        if index == self.index:
            self.decoded += 1
            if self.decoded == self.nth:
                self.kill()
        return index


def _index(data: bytes | bytearray) -> int:
    return int(bytes(data[:6]))


def _loader(
    context: str,
    *,
    persistent: bool,
    in_order: bool = True,
    num_workers: int = 2,
    decode: Any = _index,
    worker_init_fn: Any = None,
) -> ConcurrentDataLoader[Any]:
    store = MemoryConfig({f"{i:05d}.bin": _body(i) for i in range(COUNT)}, latency_s=LATENCY_S)
    return ConcurrentDataLoader(
        ObjectDataset(store, decode=decode),
        batch_size=BATCH,
        collate_fn=list,
        num_workers=num_workers,
        multiprocessing_context=context,
        persistent_workers=persistent,
        in_order=in_order,
        worker_init_fn=worker_init_fn,
        decode_threads=2,  # a dying decode holds up no other
    )


def _workers(before: set[int]) -> list[psutil.Process]:
    """Processes under this one, zombies included, that were not there ``before``, except
    multiprocessing's own helpers (its resource tracker, the forkserver)."""
    found = []
    for child in psutil.Process().children(recursive=True):
        if child.pid in before:
            continue
        try:
            if child.status() != psutil.STATUS_ZOMBIE:
                command = " ".join(child.cmdline())
                if "resource_tracker" in command or "forkserver" in command:
                    continue
        except psutil.NoSuchProcess:
            continue
        found.append(child)
    return found


def _assert_no_workers(before: set[int]) -> None:
    left = [(p.pid, p.status()) for p in _workers(before) if p.is_running()]
    assert not left, f"worker processes left (pid, status): {left}"


def _assert_names(error: WorkerError, kill: _Kill) -> None:
    message = str(error)
    assert f"pid {kill.killed_pid}" in message, message
    assert "SIGKILL" in message, message


@pytest.fixture
def before() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True)}


# spawn and forkserver workers import torch as they start (seconds on a busy machine): one
# worker for most of their cases.
SLOW = pytest.mark.slow


@pytest.mark.parametrize(
    "context, persistent, num_workers",
    [("fork", False, 2), ("fork", True, 2), pytest.param("spawn", True, 1, marks=SLOW)],
)
def test_a_worker_killed_as_it_starts(tmp_path, before, context, persistent, num_workers):
    kill = _Kill(tmp_path / "armed")
    loader = _loader(
        context,
        persistent=persistent,
        num_workers=num_workers,
        worker_init_fn=KilledAtStart(kill),
    )
    iterator = iter(loader)
    with pytest.raises(WorkerError) as caught:
        next(iterator)
    _assert_names(caught.value, kill)
    _assert_no_workers(before)
    with pytest.raises(StopIteration):  # the death ended the epoch
        next(iterator)
    assert list(loader) == EXPECTED  # new workers
    del iterator, loader
    _assert_no_workers(before)


@pytest.mark.parametrize(
    "context, persistent, in_order, num_workers",
    [
        ("fork", False, True, 2),
        ("fork", True, True, 2),
        ("fork", False, False, 2),
        ("fork", True, False, 2),
        ("fork", False, True, 1),
        ("fork", True, True, 1),
        pytest.param("spawn", False, True, 2, marks=SLOW),
        pytest.param("spawn", True, True, 1, marks=SLOW),
        pytest.param("forkserver", True, True, 1, marks=SLOW),
    ],
)
def test_a_worker_killed_mid_epoch(tmp_path, before, context, persistent, in_order, num_workers):
    kill = _Kill(tmp_path / "armed")
    lost = 4  # the batch whose first sample kills the worker decoding it
    loader = _loader(
        context,
        persistent=persistent,
        in_order=in_order,
        num_workers=num_workers,
        decode=KilledWhileDecoding(kill, index=EXPECTED[lost][0]),
    )
    got = []
    iterator = iter(loader)
    with pytest.raises(WorkerError) as caught:
        for batch in iterator:
            got.append(batch)
    _assert_names(caught.value, kill)
    if in_order:
        # The batches before the lost one, in order, as many as had arrived when the death
        # ended the epoch (a slow spawn start of the other worker may leave some undelivered).
        assert got == EXPECTED[: len(got)] and len(got) <= lost
    else:
        assert EXPECTED[lost] not in got and all(batch in EXPECTED for batch in got)
    # Every worker of the epoch is gone, the dead one reaped, while the iterator is kept.
    _assert_no_workers(before)
    assert list(iterator) == []  # the death ended the epoch
    got = list(loader)  # new workers
    assert (got if in_order else sorted(got)) == EXPECTED
    del iterator, loader
    _assert_no_workers(before)


@pytest.mark.parametrize(
    "context, num_workers", [("fork", 2), pytest.param("spawn", 1, marks=SLOW)]
)
def test_a_persistent_worker_killed_while_it_fetches_the_next_epoch(
    tmp_path, before, context, num_workers
):
    kill = _Kill(tmp_path / "armed")
    # Sample 0 is decoded twice by worker 0: in its first batch, then in the next epoch's
    # first batch, which it fetches ahead while this epoch drains; it dies then.
    loader = _loader(
        context,
        persistent=True,
        num_workers=num_workers,
        decode=KilledWhileDecoding(kill, index=0, nth=2),
    )
    assert list(loader) == EXPECTED
    with pytest.raises(WorkerError) as caught:
        for _batch in loader:
            pass
    _assert_names(caught.value, kill)
    _assert_no_workers(before)
    assert list(loader) == EXPECTED  # new workers
    assert list(loader) == EXPECTED  # and they persist
    del loader
    _assert_no_workers(before)


@pytest.mark.parametrize("in_order", [True, False])
def test_a_persistent_worker_killed_between_epochs(before, in_order):
    loader = _loader("fork", persistent=True, in_order=in_order)
    assert sorted(loader) == EXPECTED
    workers = _workers(before)
    assert len(workers) == 2, workers
    # torch's SIGCHLD handler raises its RuntimeError in whatever the main process runs,
    # here the sleep (a training step between two epochs, in a real loop).
    with contextlib.suppress(RuntimeError):
        os.kill(workers[0].pid, signal.SIGKILL)
        time.sleep(5)
    with pytest.raises(WorkerError) as caught:
        iter(loader)
    assert f"pid {workers[0].pid}" in str(caught.value)
    assert "SIGKILL" in str(caught.value)
    _assert_no_workers(before)
    assert sorted(loader) == EXPECTED  # new workers
    del loader
    _assert_no_workers(before)
