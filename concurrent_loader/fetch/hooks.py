"""How the fetch client reports what it did: to the observer each ``FetchClient.get`` is
given, so a client shared by several pipelines attributes everything to the one it was for
(:class:`~concurrent_loader.metrics.StageStats` is the pipelines' observer).
"""

from __future__ import annotations

from typing import Protocol

from ..errors import FetchError

__all__ = ["NO_OBSERVER", "FetchObserver"]


class FetchObserver(Protocol):
    def on_response(self, seconds: float, size: int, first_byte_s: float | None) -> None:
        """A GET succeeded: its own duration (no queueing), size and time to first byte."""

    def on_retry(self, error: FetchError) -> None:
        """An attempt failed with a transient ``error`` and will be retried."""

    def on_throttle(self) -> None:
        """The store throttled a GET (503 SlowDown, 429), hedges included."""

    def on_hedge(self) -> None:
        """A GET was slow, so one more was sent for the same object (a hedge)."""

    def on_hedge_won(self) -> None:
        """A hedge completed before the GET it was sent for, whose result was used."""


class _NoObserver:
    def _ignore(self, *args: object) -> None:
        pass

    on_response = on_retry = on_throttle = on_hedge = on_hedge_won = _ignore


NO_OBSERVER: FetchObserver = _NoObserver()
