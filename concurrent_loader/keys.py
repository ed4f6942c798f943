"""A compact, fork-friendly table of object keys.

:class:`KeyTable` keeps keys in one UTF-8 blob plus an offsets array: no per-key objects,
so forked workers do not copy pages by touching reference counts (PyTorch issue #13246),
and pickling to ``spawn`` workers is cheap.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import overload

import numpy as np

__all__ = ["KeyTable"]


class KeyTable(Sequence[str]):
    def __init__(self, keys: Iterable[str]) -> None:
        # surrogatepass: a tar member name that is not UTF-8 (read as tarfile reads it, with
        # surrogateescape) is a key too, and comes back as it went in.
        encoded = [key.encode("utf-8", "surrogatepass") for key in keys]
        self._offsets = np.zeros(len(encoded) + 1, dtype=np.int64)
        np.cumsum([len(k) for k in encoded], out=self._offsets[1:])
        self._blob = b"".join(encoded)

    def __len__(self) -> int:
        return len(self._offsets) - 1

    @overload
    def __getitem__(self, index: int) -> str: ...
    @overload
    def __getitem__(self, index: slice) -> list[str]: ...
    def __getitem__(self, index: int | slice) -> str | list[str]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        n = len(self)
        if index < 0:
            index += n
        if not 0 <= index < n:
            raise IndexError(f"key index {index} out of range for {n} keys")
        start, end = self._offsets[index], self._offsets[index + 1]
        return self._blob[start:end].decode("utf-8", "surrogatepass")

    def __repr__(self) -> str:
        return f"KeyTable({len(self)} keys)"
