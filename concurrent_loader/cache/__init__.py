"""A node-local object cache shared by every worker process and job on the node.

A store wrapping the root's store (:class:`CachedStoreConfig`), so retries, limits, the
pipeline and the loader do not change. It fills until its budget is reached and never
evicts. Guarantees: :mod:`.store` (reads), :mod:`.directory` (sharing, budget, crashes,
fork), :mod:`.layout` (no link followed), :mod:`.writer` and :mod:`.entry` (integrity).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Awaitable, Callable

from ..config import FetchConfig
from ..runtime import Runtime
from ..stores.base import StoreConfig
from .admin import clear_cache, describe_cache, ledger_bytes
from .cached import CachedStoreConfig, Client
from .config import CacheConfig, cache_config_for
from .directory import CacheDirectory
from .form import Transform, form_label, record_form
from .layout import CacheRefused, Handles
from .store import CachedStore

__all__ = [
    "CacheConfig",
    "CacheDirectory",
    "CacheRefused",
    "CachedStore",
    "CachedStoreConfig",
    "Transform",
    "cache_config_for",
    "clear_cache",
    "describe_cache",
    "with_cache",
]

log = logging.getLogger(__name__)


def with_cache(
    store: StoreConfig,
    cache: str | os.PathLike[str] | CacheConfig | None,
    client_for: Callable[[Runtime, StoreConfig, FetchConfig], Awaitable[Client]] | None = None,
) -> StoreConfig:
    """``store`` read through ``cache`` (a directory or a ``CacheConfig``), the directory
    made and the budget fixed here in the main process; ``store`` itself when ``cache`` is
    None, the store is local, or the directory cannot be made (one WARNING). A directory
    that is not a cache is refused with ``CacheRefused`` (a ``ConfigError``).
    ``client_for``: see :attr:`CachedStoreConfig.client_for`."""
    if cache is None:
        return store
    config = cache_config_for(cache)
    if not store.capabilities.remote:
        log.info("%s is on local disk: not cached", store)
        return store
    try:
        directory = os.path.abspath(os.path.expanduser(config.directory))
        Handles.open(directory, create=True).close()  # marks a new one; refuses a user's
        resolved = config.resolved(ledger_bytes(directory))
        CacheDirectory(resolved).close()  # lays the directory out; proves it writable
        record_form(directory, form_label(config.presize))  # for `cache info`
    except OSError as exc:
        log.warning(
            "the cache at %s cannot be used (%s): %s is read from the store",
            config.directory,
            exc,
            store,
        )
        return store
    return CachedStoreConfig(store, resolved, client_for=client_for)
