"""The local-directory backend: the baseline every remote store is held to.

Reads are blocking (``capabilities.remote`` is False): the pipeline reads and decodes an
object in one thread-pool job, without the event loop.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

from ..config import FetchConfig
from ..errors import AccessDenied, ConfigError, FetchError, ObjectNotFound, ObjectTooLarge, Reason
from .base import Body, ByteRange, Capabilities, ObjectInfo
from .shared import fetch_error

__all__ = ["LocalConfig", "LocalStore"]

_CAPABILITIES = Capabilities(remote=False, listing=True, ranges=True)


@dataclass(frozen=True)
class LocalConfig:
    """A directory; ``root`` is absolute and ends with the path separator."""

    root: str

    @property
    def capabilities(self) -> Capabilities:
        return _CAPABILITIES

    @classmethod
    def from_path(cls, path: str) -> LocalConfig:
        resolved = str(Path(path).expanduser().resolve())
        if not resolved.endswith(os.sep):
            resolved += os.sep
        if not os.path.isdir(resolved):
            raise ConfigError(f"no such directory: {resolved}")
        return cls(resolved)

    def resolved(self) -> LocalConfig:
        return self

    def url_for(self, key: str) -> str:
        return os.path.join(self.root, key)

    def open(self, fetch: FetchConfig) -> LocalStore:
        return LocalStore(self, fetch)

    def __str__(self) -> str:
        return self.root


class LocalStore:
    """Reads ``{root}/{key}``, blocking; ``get`` runs the same read on the loop's executor."""

    capabilities = _CAPABILITIES

    def __init__(self, config: LocalConfig, fetch: FetchConfig) -> None:
        self.config = config
        self._max_bytes = fetch.max_object_bytes

    def url_for(self, key: str) -> str:
        return self.config.url_for(key)

    def get_blocking(self, key: str, byte_range: ByteRange | None = None) -> bytes:
        path = self.url_for(key)
        try:
            with open(path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                wanted = byte_range.length if byte_range else size
                if wanted > self._max_bytes:
                    message = f"{wanted} bytes > max_object_bytes={self._max_bytes}"
                    raise fetch_error(ObjectTooLarge, message, path)
                if byte_range is None:
                    return f.read()
                data = os.pread(f.fileno(), byte_range.length, byte_range.start)
                if len(data) != byte_range.length:
                    message = (
                        f"range {byte_range.start}-{byte_range.end} is past the end ({size} B)"
                    )
                    raise fetch_error(FetchError, message, path, Reason.BAD_REQUEST)
                return data
        except FileNotFoundError as exc:
            raise fetch_error(ObjectNotFound, "no such file", path) from exc
        except IsADirectoryError as exc:
            raise fetch_error(ObjectNotFound, "is a directory", path) from exc
        except PermissionError as exc:
            raise fetch_error(AccessDenied, str(exc), path) from exc
        except OSError as exc:
            raise fetch_error(FetchError, str(exc), path, Reason.UNKNOWN) from exc

    async def get(self, key: str, byte_range: ByteRange | None = None) -> Body:
        loop = asyncio.get_running_loop()
        return Body(await loop.run_in_executor(None, self.get_blocking, key, byte_range))

    def list_blocking(self) -> Iterator[ObjectInfo]:
        root = self.config.root
        for directory, dirnames, filenames in os.walk(root, followlinks=True):
            dirnames.sort()
            rel = os.path.relpath(directory, root)
            for name in filenames:
                key = name if rel == "." else f"{rel}/{name}".replace(os.sep, "/")
                yield ObjectInfo(key, os.path.getsize(os.path.join(directory, name)))

    async def list(self) -> AsyncIterator[ObjectInfo]:
        for info in self.list_blocking():
            yield info

    async def close(self) -> None:
        pass
