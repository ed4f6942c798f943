"""One object per sample: item ``i`` is ``decode(bytes of keys[i])``."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

import numpy as np

from ..config import FetchConfig
from ..errors import DecodeError, LoaderError, Reason
from ..keys import KeyTable
from ..stores.base import StoreConfig
from .base import Read

__all__ = ["CallDecoder", "ObjectDecoder", "ObjectSource"]


class ObjectDecoder(Protocol):
    def __call__(self, index: int, data: bytes | bytearray, url: str) -> Any:
        """Sample ``index`` from the bytes of its object ``url``."""


class CallDecoder:
    """``decode(data)``, or the bytes themselves when ``decode`` is None. What ``decode``
    raises becomes a ``DecodeError`` naming the object (the original as ``__cause__``); a
    ``LoaderError`` without an object gets the object's URL."""

    def __init__(self, decode: Callable[[bytes | bytearray], Any] | None) -> None:
        self.decode = decode

    def __call__(self, index: int, data: bytes | bytearray, url: str) -> Any:
        if self.decode is None:
            return bytes(data)
        try:
            return self.decode(data)
        except LoaderError as exc:
            if exc.url is not None:
                raise
            raise exc.for_object(url) from exc.__cause__
        except Exception as exc:
            raise DecodeError(
                f"decode raised {type(exc).__name__}: {exc}",
                url=url,
                stage="decode",
                cause=Reason.UNDECODABLE,
            ) from exc


class ObjectSource:
    """``keys[i]`` of ``store``, decoded by ``decoder``; ``sizes[i]`` (bytes) when listed."""

    def __init__(
        self,
        store: StoreConfig,
        keys: KeyTable,
        decoder: ObjectDecoder,
        fetch_config: FetchConfig,
        sizes: np.ndarray | None = None,
    ) -> None:
        if sizes is not None and len(sizes) != len(keys):
            raise ValueError(f"{len(sizes)} sizes for {len(keys)} keys")
        self.store = store
        self.keys = keys
        self.decoder = decoder
        self.fetch_config = fetch_config
        self.sizes = sizes

    def __len__(self) -> int:
        return len(self.keys)

    def reads(self, index: int) -> Sequence[Read]:
        size = int(self.sizes[index]) if self.sizes is not None else None
        return (Read(self.keys[index], size=size),)

    def decode(self, index: int, bodies: Sequence[bytes | bytearray]) -> Any:
        return self.decoder(index, bodies[0], self.url_for(index))

    def url_for(self, index: int) -> str:
        return self.store.url_for(self.keys[index])

    def __repr__(self) -> str:
        return f"ObjectSource({self.store}, {len(self.keys)} objects)"
