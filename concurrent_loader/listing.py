"""Listing a store's root, with an optional progress bar, for datasets and the command line.

Keys are relative to the root and sorted (the same order locally and on S3), without S3
"directory" markers; an empty root, or a store that cannot list, is a ``ConfigError``
naming it.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from .config import FetchConfig
from .errors import ConfigError, Reason
from .runtime import acquire_runtime
from .stores.base import BlockingStore, ObjectInfo, StoreConfig

__all__ = ["empty_root", "list_store", "progress"]


def list_store(
    store: StoreConfig,
    config: FetchConfig | None = None,
    *,
    on_object: Callable[[], None] | None = None,
) -> list[ObjectInfo]:
    config = config or FetchConfig()
    capabilities = store.capabilities
    if not capabilities.listing:
        raise ConfigError(
            f"{store} cannot be listed: pass keys= or a manifest", url=store.url_for("")
        )
    found: list[ObjectInfo] = []

    def keep(info: ObjectInfo) -> None:
        if info.key and not info.key.endswith("/"):
            found.append(info)
            if on_object is not None:
                on_object()

    if not capabilities.remote:
        blocking: BlockingStore = store.open(config)  # type: ignore[assignment]
        for info in blocking.list_blocking():
            keep(info)
    else:

        async def collect() -> None:
            opened = store.open(config)
            try:
                async for info in opened.list():
                    keep(info)
            finally:
                await opened.close()

        runtime = acquire_runtime()
        try:
            runtime.run(collect())
        finally:
            runtime.release()
    found.sort(key=lambda item: item.key)
    if not found:
        raise empty_root(store, f"no objects under {store}")
    return found


def empty_root(store: StoreConfig, message: str, key: str = "") -> ConfigError:
    """The error (``EmptyPrefix``) for a root ``store`` that holds nothing to read: ``message``
    names the root (or its object ``key``)."""
    return ConfigError(message, url=store.url_for(key), cause=Reason.EMPTY_PREFIX)


@contextmanager
def progress(enabled: bool, description: str) -> Iterator[Callable[[], None] | None]:
    """A per-object tick for a tqdm bar on stderr, or None without tqdm (or when disabled)."""
    if not enabled:
        yield None
        return
    try:
        from tqdm import tqdm
    except ImportError:
        yield None
        return
    with tqdm(desc=description, unit=" objects", file=sys.stderr, leave=False) as bar:
        yield lambda: bar.update(1)
