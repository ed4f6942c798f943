"""What every layer of the fetch client is: a :class:`Getter` of one :class:`Request`."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, Protocol

from ..stores.base import Body, ByteRange
from .hooks import FetchObserver

__all__ = ["Getter", "Request", "running_task"]


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


def running_task(
    loop: asyncio.AbstractEventLoop | None,
) -> tuple[asyncio.AbstractEventLoop, asyncio.Task[Any]]:
    """The running loop and task; no ``getpid`` (``get_running_loop``'s) when ``loop`` runs."""
    task = asyncio.current_task(loop) if loop is not None else None
    if task is None:
        loop = asyncio.get_running_loop()
        task = asyncio.current_task(loop)
        assert task is not None  # a coroutine awaited on a running loop
    assert loop is not None
    return loop, task
