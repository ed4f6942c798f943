"""What the main process does as an epoch starts new worker processes.

- :func:`fresh_credentials`: expiring credentials (instance roles, SSO, assumed roles) were
  resolved when the dataset was made; workers started hours later would receive a snapshot
  near its expiry and each build its own botocore chain (an import, ``SSLContext`` objects,
  a metadata request per worker). Before new workers start, a snapshot within botocore's
  refresh window is resolved again, once, here.
- :func:`frozen_heap`: while workers are forked, the objects of the main process are moved to
  the garbage collector's permanent generation (``gc.freeze()``) and back after
  (``gc.unfreeze()``), so a worker never collects them: its collections do not write to the
  pages of inherited objects (they stay shared with the main process), and a cycle that was
  garbage at the fork (a client holding a socket, say) is never finalised in a worker, where
  its ``__del__`` would act on a socket or TLS session the main process still uses. A
  program that froze its heap itself (the pattern Python's documentation gives) is left as
  it is.
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
    """The heap frozen for the garbage collector meanwhile (see the module docstring)."""
    if gc.get_freeze_count() or not gc.isenabled():
        yield  # the program manages the collector itself
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()
