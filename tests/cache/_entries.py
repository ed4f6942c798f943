"""Reading a cache entry by its path, as the tests look at what the cache wrote."""

from __future__ import annotations

import os

from concurrent_loader.cache.layout import Entry, read_entry_fd


def read_entry(path: str, source: str) -> Entry | None:
    """The entry at ``path`` for ``source`` (not through a link); None when there is none."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    try:
        return read_entry_fd(fd, path, source)
    finally:
        os.close(fd)
