"""What every layer of the fetch client is: a :class:`Getter` of one :class:`Request`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from ..stores.base import Body, ByteRange
from .hooks import FetchObserver

__all__ = ["Getter", "Request"]


def _nothing() -> None:
    pass


@dataclass(frozen=True, slots=True)
class Request:
    """One object asked of the client. ``on_send`` is called each time an attempt at it gets
    its request slot, just before it is sent (the retry layer starts its clock there)."""

    key: str
    byte_range: ByteRange | None
    url: str
    observer: FetchObserver
    on_send: Callable[[], None] = _nothing


class Getter(Protocol):
    async def get(self, request: Request) -> Body: ...
