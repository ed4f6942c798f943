"""What the cache tests run in other processes (spawned: importable by name)."""

from __future__ import annotations

import asyncio
import hashlib
import io
import json
import os
import time
from pathlib import Path
from typing import Any

from concurrent_loader import ConcurrentDataLoader, FetchConfig, ObjectDataset
from concurrent_loader.cache import CachedStoreConfig


def read_epoch(dataset: ObjectDataset, out: str, start: Any) -> None:
    """One epoch (2 workers, sampler order), after ``start`` (a barrier); writes
    {index: sha256} of what it got to ``out``."""
    loader = ConcurrentDataLoader(dataset, batch_size=8, num_workers=2, prefetch_batches=2)
    start.wait(60)
    got: dict[int, str] = {}
    index = 0
    for batch in loader:
        for body in batch:
            got[index] = hashlib.sha256(body).hexdigest()
            index += 1
    Path(out).write_text(json.dumps(got))


def _hang(marker: str) -> None:
    Path(marker).touch()
    time.sleep(3600)


def write_and_hang(config: CachedStoreConfig, key: str, marker: str, where: str) -> None:
    """Read ``key`` through the cache; its writer stops for good at ``where`` ("data": half
    of the entry written, "rename": all written, the ledger updated, not yet renamed)."""
    from concurrent_loader.cache import directory

    if where == "data":

        class HalfThenHang(io.FileIO):
            def write(self, data: Any) -> int:
                super().write(memoryview(data)[: len(data) // 2])
                _hang(marker)
                return 0

        # The entry's temporary file is opened with open(fd, "wb"): this one writes half.
        directory.open = lambda fd, mode: HalfThenHang(fd, mode)  # type: ignore[attr-defined]
    else:

        def hang_instead(*args: Any, **kwargs: Any) -> None:
            _hang(marker)

        directory.os.replace = hang_instead  # type: ignore[assignment]

    async def read() -> None:
        store = config.open(FetchConfig())
        await store.get(key)
        await store.close()  # waits for the writer, which never finishes

    asyncio.run(read())
    os._exit(3)  # not reached: the test kills this process first
