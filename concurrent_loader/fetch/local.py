"""Reading objects from a local directory (the baseline every remote store is held to)."""

from __future__ import annotations

import asyncio
import os

from ..config import FetchConfig
from ..errors import AccessDenied, FetchError, ObjectNotFound, ObjectTooLarge, Reason
from .base import Reader

__all__ = ["LocalReader"]


class LocalReader(Reader):
    """Reads ``{root}/{key}``. Blocking, so the pipeline reads and decodes in one pool job."""

    def __init__(self, root: str, *, config: FetchConfig | None = None) -> None:
        super().__init__(config or FetchConfig())
        self.root = root

    def url_for(self, key: str) -> str:
        return os.path.join(self.root, key)

    def read_blocking(self, key: str) -> bytes:
        path = os.path.join(self.root, key)
        try:
            with open(path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                if size > self.config.max_object_bytes:
                    raise ObjectTooLarge(
                        f"{size} bytes > max_object_bytes={self.config.max_object_bytes}",
                        url=path,
                        stage="fetch",
                        cause=Reason.OBJECT_TOO_LARGE,
                    )
                return f.read()
        except FileNotFoundError as exc:
            raise ObjectNotFound(
                "no such file", url=path, stage="fetch", cause=Reason.NOT_FOUND
            ) from exc
        except IsADirectoryError as exc:
            raise ObjectNotFound(
                "is a directory", url=path, stage="fetch", cause=Reason.NOT_FOUND
            ) from exc
        except PermissionError as exc:
            raise AccessDenied(
                str(exc), url=path, stage="fetch", cause=Reason.ACCESS_DENIED
            ) from exc
        except OSError as exc:
            raise FetchError(str(exc), url=path, stage="fetch", cause=Reason.UNKNOWN) from exc

    async def _get_once(self, key: str, url: str) -> tuple[bytes, float | None]:
        data = await asyncio.get_running_loop().run_in_executor(None, self.read_blocking, key)
        return data, None
