"""What the Ray tests' actors run: functions and datasets that an actor imports by name
(``tests.executors.cluster.workload``), since a test module is not importable there."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from torch.utils.data import Dataset

from tests.helpers import body_for, index_of, key_for

__all__ = ["SlowIndex", "StartLog", "fail_to_start", "index_of", "write_numbered"]


def write_numbered(root: Path, count: int) -> Path:
    """``count`` numbered objects (``tests.helpers``) as files under ``root``."""
    root.mkdir(parents=True, exist_ok=True)
    for i in range(count):
        (root / key_for(i)).write_bytes(body_for(i))
    return root


class SlowIndex:
    """A decode that takes ``seconds`` per sample, so an epoch lasts long enough to act in."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def __call__(self, data: bytes | bytearray) -> int:
        time.sleep(self.seconds)
        return index_of(data)


class StartLog(Dataset[int]):
    """Sample ``i`` is ``i``; each ``__getitem__`` appends ``i`` to the file ``log`` first, so
    the test sees which samples any actor has started."""

    def __init__(self, size: int, log: Path) -> None:
        self.size, self.log = size, log

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> Any:
        fd = os.open(self.log, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        try:
            os.write(fd, f"{index}\n".encode())
        finally:
            os.close(fd)
        return index

    def started(self) -> set[int]:
        if not self.log.exists():
            return set()
        return {int(line) for line in self.log.read_text().split()}


def fail_to_start(worker: int) -> None:
    """A ``worker_init_fn`` that fails, as one needing what the actor's node lacks would."""
    raise RuntimeError(f"worker {worker}: this node has no scratch disk")
