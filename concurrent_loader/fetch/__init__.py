"""Keys -> bytes: a store wrapped in policies.

:class:`FetchClient` (:mod:`.client`) wraps any :class:`~concurrent_loader.stores.Store` in
retry, the in-flight limit (:mod:`.limits`, :mod:`.tuning`), deadlines, timing and hedged
GETs (:mod:`.hedge`); :mod:`.parts` reads a large object as ranged GETs through it;
:mod:`.hooks` is how results are reported, :mod:`.open` where each process gets its client.
"""

from .client import FetchClient
from .hedge import HedgeLayer
from .hooks import NO_OBSERVER, FetchObserver
from .limits import AdaptiveLimit, ByteBudget
from .open import client_for

__all__ = [
    "NO_OBSERVER",
    "AdaptiveLimit",
    "ByteBudget",
    "FetchClient",
    "FetchObserver",
    "HedgeLayer",
    "client_for",
]
