"""How the fetch client reports what it did: to the caller's observer, per call.

Each ``FetchClient.get`` takes the observer of the pipeline that asked, so a client shared
by several pipelines of one process attributes every response, retry, throttle and hedge to
the pipeline it was for. :class:`~concurrent_loader.metrics.StageStats` is the observer the
pipelines pass.
"""

from __future__ import annotations

from typing import Protocol

from ..errors import FetchError

__all__ = ["NO_OBSERVER", "FetchObserver"]


class FetchObserver(Protocol):
    def on_response(self, seconds: float, size: int, first_byte_s: float | None) -> None:
        """A GET succeeded: the request's own duration (not queueing or backoff), its size
        and its time to first byte when known."""

    def on_retry(self, error: FetchError) -> None:
        """An attempt failed with a transient ``error`` and will be retried."""

    def on_throttle(self) -> None:
        """The store asked us to slow down (503 SlowDown, 429): once per throttled GET,
        hedged GETs included."""

    def on_hedge(self) -> None:
        """A GET was slow, so one more was sent for the same object (a hedge)."""

    def on_hedge_won(self) -> None:
        """A hedge completed before the GET it was sent for, whose result was used."""


class _NoObserver:
    def _ignore(self, *args: object) -> None:
        pass

    on_response = on_retry = on_throttle = on_hedge = on_hedge_won = _ignore


NO_OBSERVER: FetchObserver = _NoObserver()
