"""No silent hang: a loader whose work stops raises LoaderStalled naming what it waited on."""

import gc
import logging
import threading
import time

import pytest
from torch.utils.data import Dataset

from concurrent_loader import ConcurrentDataLoader, ConfigError, LoaderStalled, ObjectDataset
from concurrent_loader.testing.memory import STALL, MemoryConfig


def _wait_for_loader_threads_to_end(before: set[threading.Thread], timeout_s: float = 10.0) -> None:
    """A stalled pipeline's threads end once its iterator is dropped and the stalled work is
    cancelled or released; wait for that here, so no test leaves them behind."""
    gc.collect()
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and any(
        t.name.startswith("concurrent-loader") and t not in before for t in threading.enumerate()
    ):
        time.sleep(0.02)


def _stalled_store(stalled_key: str) -> MemoryConfig:
    objects = {f"{i:03d}": bytes([i]) for i in range(8)}
    return MemoryConfig(objects, script=lambda key, attempt: STALL if key == stalled_key else None)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_get_that_never_answers_ends_in_loader_stalled(num_workers, caplog):
    before = set(threading.enumerate())
    ds = ObjectDataset(_stalled_store("005"), keys=[f"{i:03d}" for i in range(8)])
    loader = ConcurrentDataLoader(
        ds, batch_size=2, num_workers=num_workers, stall_timeout_s=1.5, collate_fn=list
    )
    got = []
    with caplog.at_level(logging.WARNING), pytest.raises(LoaderStalled) as info:
        for batch in loader:
            got.extend(batch)
    # Batches before the stalled one arrived; the error says what was waited on, and where.
    assert got[:4] == [b"\x00", b"\x01", b"\x02", b"\x03"]
    message = str(info.value)
    assert "GETs in flight" in message
    assert "memory://test/005" in message  # the oldest GET in flight is the stalled one
    assert "concurrent-loader-io" in message  # every thread's stack is included
    assert info.value.cause == "Stalled"
    del loader, info
    _wait_for_loader_threads_to_end(before)
    if num_workers == 0:
        assert any("has waited" in r.getMessage() for r in caplog.records)


class _Blocking(Dataset):
    def __init__(self) -> None:
        self.release = threading.Event()

    def __len__(self) -> int:
        return 4

    def __getitem__(self, index: int) -> int:
        if index == 2:
            block_here_forever(self.release)
        return index


def block_here_forever(event: threading.Event) -> None:
    event.wait()


def test_a_blocked_getitem_is_named_by_its_stack():
    before = set(threading.enumerate())
    ds = _Blocking()
    loader = ConcurrentDataLoader(ds, batch_size=1, stall_timeout_s=1.0)
    iterator = iter(loader)
    assert next(iterator).tolist() == [0]
    assert next(iterator).tolist() == [1]
    with pytest.raises(LoaderStalled) as info:
        next(iterator)
    assert "block_here_forever" in str(info.value)
    ds.release.set()  # let the pool thread finish so nothing is left behind
    iterator.close()
    del iterator, loader, info
    _wait_for_loader_threads_to_end(before)


def test_stall_timeout_is_validated():
    ds = ObjectDataset(MemoryConfig({"a": b"x"}), keys=["a"])
    with pytest.raises(ConfigError, match="stall_timeout_s"):
        ConcurrentDataLoader(ds, stall_timeout_s=0)
