"""What the main process does as an epoch starts new worker processes.

- :func:`fresh_credentials`: a credential snapshot near expiry is resolved again, once,
  before workers get a copy of it;
- :func:`frozen_heap`: the main process's objects are ``gc.freeze()``-d while workers fork,
  so a worker never collects them (inherited pages stay shared, and no inherited garbage
  cycle is finalised in a worker, acting on sockets the main process still uses). A heap
  the program froze itself is left as it is.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

from torch.utils.data import Dataset

from ..pipeline import source_of
from ..stores.s3.credentials import CredentialSource

__all__ = ["fresh_credentials", "frozen_heap"]


def fresh_credentials(dataset: Dataset[object]) -> None:
    """Resolve the dataset's S3 credential snapshot again if it is about to expire (that of
    the S3 store inside a wrapper, a cache or read-ahead, too)."""
    store = getattr(source_of(dataset), "store", None)
    while store is not None and not hasattr(store, "credentials"):
        store = getattr(store, "inner", None)  # a store config wrapping another
    credentials = getattr(store, "credentials", None)
    if isinstance(credentials, CredentialSource):
        credentials.refresh_snapshot()


@contextlib.contextmanager
def frozen_heap() -> Iterator[None]:
    if gc.get_freeze_count() or not gc.isenabled():
        yield  # the program manages the collector itself
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()
