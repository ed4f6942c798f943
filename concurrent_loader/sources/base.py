"""The contract between datasets and the pipeline: a :class:`SampleSource` turns an index
into reads from one store and, given their bytes, into the sample (on a decode thread). A
source is picklable and holds no open resource."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from ..config import FetchConfig
from ..stores.base import ByteRange, StoreConfig

__all__ = ["NamingSource", "Read", "SampleSource"]


@dataclass(frozen=True, slots=True)
class Read:
    """One read of a sample: ``key`` of the source's store, all of it or ``byte_range``;
    ``size`` is the body's expected size when known (it feeds the byte budget)."""

    key: str
    byte_range: ByteRange | None = None
    size: int | None = None


@runtime_checkable
class SampleSource(Protocol):
    store: StoreConfig
    fetch_config: FetchConfig

    def __len__(self) -> int: ...

    def reads(self, index: int) -> Sequence[Read]:
        """The reads sample ``index`` (in range) needs."""

    def decode(self, index: int, bodies: Sequence[bytes | bytearray]) -> Any:
        """Sample ``index`` from the bodies of its reads, in order."""

    def url_for(self, index: int) -> str:
        """The name of sample ``index`` in messages."""


@runtime_checkable
class NamingSource(SampleSource, Protocol):
    """A source whose samples are parts of larger objects (tar shards), which names the
    sample in the error of a failed read itself."""

    def read_failed(self, index: int, exc: BaseException) -> BaseException:
        """``exc``, a failed read of sample ``index``, as the same kind of error naming the
        sample's object, member and offset."""
