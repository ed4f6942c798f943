"""Stage 1 of the pipeline: keys -> bytes, through a store wrapped in policies.

:class:`FetchClient` (:mod:`.client`) composes retry, the in-flight limit, deadlines,
timing and hedged GETs (:mod:`.hedge`) around any :class:`~concurrent_loader.stores.Store`;
:mod:`.limits` holds the process's limits (requests in flight, bytes held); :mod:`.hooks`
how results are reported; :mod:`.open` where each process gets its client.
"""

from .client import FetchClient
from .hedge import HedgeLayer
from .hooks import NO_OBSERVER, FetchObserver
from .limits import AdaptiveLimit, ByteBudget
from .open import client_for, fetch_blocking

__all__ = [
    "NO_OBSERVER",
    "AdaptiveLimit",
    "ByteBudget",
    "FetchClient",
    "FetchObserver",
    "HedgeLayer",
    "client_for",
    "fetch_blocking",
]
