"""What every layer of the fetch client is: a :class:`Getter` of one :class:`Request`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from ..stores.base import Body, ByteRange
from .hooks import FetchObserver

__all__ = ["Getter", "Request"]


@dataclass(slots=True)
class Request:
    """One object asked of the client. ``deadline`` is when its time budget runs out (loop
    time), set when its first attempt is sent: the object's clock starts there."""

    key: str
    byte_range: ByteRange | None
    url: str
    observer: FetchObserver
    deadline: float | None = None


class Getter(Protocol):
    async def get(self, request: Request) -> Body: ...
