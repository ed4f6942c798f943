"""Loading samples outside the pipeline (``dataset[i]``, ``__getitems__``): remote reads
all at once through the process's fetch client, local ones and decoding on the caller's
thread."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

from ..fetch import client_for
from ..runtime import Runtime
from ..stores.base import BlockingStore
from .base import SampleSource

__all__ = ["load_samples"]


def load_samples(
    source: SampleSource,
    indices: Sequence[int],
    runtime: Callable[[], Runtime],
    blocking: Callable[[], BlockingStore],
) -> list[Any]:
    """Samples ``indices`` of ``source``; ``runtime()`` gives a runtime when one is needed,
    ``blocking()`` the open store of a source that is not remote."""
    store, config = source.store, source.fetch_config
    if not store.capabilities.remote:
        opened = blocking()
        return [
            source.decode(i, [opened.get_blocking(r.key, r.byte_range) for r in source.reads(i)])
            for i in indices
        ]
    loop_runtime = runtime()

    async def fetch_all() -> list[list[bytes | bytearray]]:
        client = await client_for(loop_runtime, store, config)

        async def one(index: int) -> list[bytes | bytearray]:
            reads = source.reads(index)
            return list(await asyncio.gather(*(client.get(r.key, r.byte_range) for r in reads)))

        return list(await asyncio.gather(*(one(i) for i in indices)))

    bodies = loop_runtime.run(fetch_all())
    return [source.decode(i, b) for i, b in zip(indices, bodies, strict=True)]
