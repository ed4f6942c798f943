"""One object per sample: item ``i`` is ``decode(bytes of keys[i])``."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from ..config import FetchConfig
from ..errors import DecodeError, LoaderError, Reason
from ..keys import KeyTable
from ..stores.base import StoreConfig
from .base import Read

__all__ = ["CallDecoder", "ObjectDecoder", "ObjectSource", "call_decode"]


class ObjectDecoder(Protocol):
    def __call__(self, index: int, data: bytes | bytearray, url: str) -> Any:
        """Sample ``index`` from the bytes of its object ``url``."""


def call_decode(
    decode: Callable[[Any], Any],
    data: Any,
    url: str,
    part: str | Callable[[], str] | None = None,
) -> Any:
    """``decode(data)``, for the object ``url`` (``part`` of it, or ``part()``: worded only
    for an error). What ``decode`` raises becomes a ``DecodeError`` naming them (the
    original as ``__cause__``); a ``LoaderError`` without an object gets them."""
    try:
        return decode(data)
    except LoaderError as exc:
        if exc.url is not None:
            raise
        raise exc.for_object(url, part() if callable(part) else part) from exc.__cause__
    except Exception as exc:
        part = part() if callable(part) else part
        message = f"decode raised {type(exc).__name__}: {exc}"
        raise DecodeError(
            message if part is None else f"{part}: {message}",
            url=url,
            stage="decode",
            cause=Reason.UNDECODABLE,
        ) from exc


@dataclass
class CallDecoder:
    """``decode(data)`` (:func:`call_decode`), or the bytes themselves when ``decode`` is None."""

    decode: Callable[[bytes | bytearray], Any] | None

    def __call__(self, index: int, data: bytes | bytearray, url: str) -> Any:
        if self.decode is None:
            return bytes(data)
        return call_decode(self.decode, data, url)


@dataclass(eq=False, repr=False)
class ObjectSource:
    """``keys[i]`` of ``store``, decoded by ``decoder``; the object's size in bytes when the
    table has a ``sizes`` column (a listing's, or a binary manifest's)."""

    store: StoreConfig
    keys: KeyTable
    decoder: ObjectDecoder
    fetch_config: FetchConfig

    @property
    def sizes(self) -> np.ndarray | None:
        return self.keys.column("sizes")

    def __len__(self) -> int:
        return len(self.keys)

    def reads(self, index: int) -> Sequence[Read]:
        sizes = self.keys.column("sizes")
        return (Read(self.keys[index], size=None if sizes is None else int(sizes[index])),)

    def decode(self, index: int, bodies: Sequence[bytes | bytearray]) -> Any:
        return self.decoder(index, bodies[0], self.url_for(index))

    def url_for(self, index: int) -> str:
        return self.store.url_for(self.keys[index])

    def __repr__(self) -> str:
        return f"ObjectSource({self.store}, {len(self.keys)} objects)"
