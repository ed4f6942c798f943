"""Listing a root's objects (local directory or S3 prefix), with an optional progress bar.

One implementation for datasets (which need keys) and the command line (which also needs
sizes): keys are relative to the root, sorted (the same order locally and on S3, so item
``i`` is the same object in both), without S3 "directory" marker objects; an empty root is
a ``ConfigError`` naming it.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from .config import FetchConfig
from .errors import ConfigError, Reason
from .fetch import CredentialSource, ListedObject, list_objects
from .location import Location
from .runtime import acquire_runtime

__all__ = ["list_location", "progress"]


def list_location(
    location: Location,
    *,
    endpoint_url: str | None = None,
    region: str | None = None,
    credentials: CredentialSource | None = None,
    config: FetchConfig | None = None,
    on_object: Callable[[], None] | None = None,
) -> list[ListedObject]:
    """Every object under ``location``, sorted by key."""
    if location.is_local:
        if not os.path.isdir(location.prefix):
            raise ConfigError(f"no such directory: {location.prefix}")
        found = list(_walk_local(location.prefix, on_object))
    elif location.scheme == "s3":

        async def collect() -> list[ListedObject]:
            listed = []
            async for obj in list_objects(
                location.bucket,
                location.prefix,
                endpoint_url=endpoint_url,
                region=region,
                credentials=credentials,
                config=config,
            ):
                if obj.key and not obj.key.endswith("/"):
                    listed.append(obj)
                    if on_object is not None:
                        on_object()
            return listed

        runtime = acquire_runtime()
        try:
            found = runtime.run(collect())
        finally:
            runtime.release()
    else:
        raise ConfigError(
            f"{location} is plain HTTP(S), which cannot be listed: pass keys= or a manifest"
        )
    found.sort(key=lambda item: item.key)
    if not found:
        raise ConfigError(
            f"no objects under {location}", url=str(location), cause=Reason.EMPTY_PREFIX
        )
    return found


def _walk_local(prefix: str, on_object: Callable[[], None] | None) -> Iterator[ListedObject]:
    for directory, dirnames, filenames in os.walk(prefix, followlinks=True):
        dirnames.sort()
        rel = os.path.relpath(directory, prefix)
        for name in filenames:
            path = os.path.join(directory, name)
            key = name if rel == "." else f"{rel}/{name}".replace(os.sep, "/")
            if on_object is not None:
                on_object()
            yield ListedObject(key, os.path.getsize(path))


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
