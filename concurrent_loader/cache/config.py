"""What a node-local cache is: a directory and a byte budget, resolved once in the main
process when the dataset is made, so every worker enforces the same figure."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass

from ..config import check_count
from ..errors import ConfigError
from .form import Transform, check_transform

__all__ = ["CacheConfig", "cache_config_for"]

#: the share of the disk's free space (plus what the cache already holds) that a cache
#: without ``max_bytes`` may use
DEFAULT_DISK_SHARE = 0.8


@dataclass(frozen=True)
class CacheConfig:
    """A node-local object cache in ``directory``, shared by every process that names it.

    - ``max_bytes``: the budget in bytes on disk, across every process using the directory;
      None: 80 % of the disk's free space plus what the cache holds, when the dataset is made.
    - ``presize``: keep each object in this form instead (``apply(data, url) -> bytes`` and
      a stable ``identity``, such as ``Presize(short_side=256)``; :mod:`.form`).

    The cache fills until the budget is reached and never evicts, so under random sampling
    the hit rate is budget / dataset every epoch. An entry is never revalidated: clear the
    cache (``concurrent-loader cache clear DIR``) after changing a dataset in place.
    """

    directory: str
    max_bytes: int | None = None
    presize: Transform | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.directory, str) or not self.directory:
            raise ConfigError(f"cache directory must be a non-empty path, got {self.directory!r}")
        if self.max_bytes is not None:
            check_count("cache max_bytes", self.max_bytes, 0)
        if self.presize is not None:
            check_transform(self.presize)

    def resolved(self, held_bytes: int = 0) -> CacheConfig:
        """This config with an absolute directory and a budget in bytes; ``held_bytes``, what
        the cache already holds, counts as free for the default budget."""
        directory = os.path.abspath(os.path.expanduser(self.directory))
        budget = self.max_bytes
        if budget is None:
            stat = os.statvfs(directory)
            budget = int(DEFAULT_DISK_SHARE * (stat.f_bavail * stat.f_frsize + held_bytes))
        return dataclasses.replace(self, directory=directory, max_bytes=budget)

    @property
    def budget(self) -> int:
        if self.max_bytes is None:
            raise ValueError("the cache's budget is resolved when a dataset is made")
        return self.max_bytes


def cache_config_for(cache: str | os.PathLike[str] | CacheConfig) -> CacheConfig:
    """``cache=`` as given to a dataset: a directory (the defaults) or a ``CacheConfig``."""
    if isinstance(cache, CacheConfig):
        return cache
    if isinstance(cache, (str, os.PathLike)):
        return CacheConfig(os.fspath(cache))
    raise ConfigError(f"cache must be a directory or a CacheConfig, got {type(cache).__name__}")
