"""What every layer of the fetch client is: a :class:`Getter` of one :class:`Request`."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, Protocol

from ..stores.base import Body, ByteRange
from .hooks import FetchObserver

__all__ = ["Getter", "Request"]


@dataclass(slots=True)
class Request:
    """One object asked of the client. ``deadline`` is when its time budget runs out (loop
    time), set when its first attempt is sent: the object's clock starts there. ``loop``
    and ``task`` are the caller's, set by the attempt layer for the layers under it."""

    key: str
    byte_range: ByteRange | None
    url: str
    observer: FetchObserver
    deadline: float | None = None
    loop: asyncio.AbstractEventLoop | None = None
    task: asyncio.Task[Any] | None = None


class Getter(Protocol):
    async def get(self, request: Request) -> Body: ...
