"""Hedged GETs: a slow GET gets one more for the same object, and the first to complete wins.

After "The Tail at Scale" (Dean and Barroso, 2013). :class:`HedgeLayer` sits inside one
attempt, below the retry, limit, deadline and timing layers and above the per-GET throttle
accounting, so:

- the hedge timer starts when the attempt is sent (it holds its request slot), never while
  it waits for one; the delay is :class:`HedgeDelay`'s estimate (a high percentile of this
  client's recent GET latencies, within a floor and a ceiling);
- a hedge is sent only if the budget (:class:`HedgeBudget`) has a token, the store did
  not throttle most GETs of the last round, and one of the limit's hedge slots is free at
  once: a hedge never queues, and it does not take one of the limit's slots, because the
  GET it overtakes holds one and the limit may be small (a throttling store cuts it): a
  hedge that waited for a slot behind its own stalled GET would never be sent. At most
  ``FetchConfig.max_hedges_in_flight`` hedges are in flight beyond the limit, so the GETs
  in flight stay within ``limit + max_hedges_in_flight`` (the transport's connection cap);
- at most one hedge per attempt. The first of the two to return bytes wins; the other is
  cancelled (the transport closes a cancelled connection) and awaited, so its slot is
  free again when the attempt returns. An error that a retry cannot mend (404, 403, ...)
  from either ends the attempt at once. A transient error of the first GET waits for the
  hedge; a transient error of the hedge ends the attempt with it (and the first GET is
  cancelled), because the first GET has outlasted the delay and the hedge's whole life,
  so it is most likely stalled: the retry layer sends a fresh attempt after its backoff,
  rather than waiting for the stall to end or for ``Timeouts.read``;
- the attempt is one object to the layers above: one response reported, one deadline, and,
  in the pipeline, one byte reservation (made before the client is called). The loser's
  body, bounded like every body by ``max_object_bytes`` (the store refuses a larger one
  before reading it), is dropped when it is cancelled.

Each GET's own throttle is still counted (``on_throttle``) and lowers the limit, hedges
included; the observer also hears ``on_hedge`` for each hedge sent and ``on_hedge_won``
when one wins.
"""

from __future__ import annotations

import asyncio
from collections import deque

from ..config import HedgeConfig
from ..errors import FetchError
from ..metrics.percentile import percentile
from ..stores.base import Body
from .getter import Getter, Request
from .limits import AdaptiveLimit

__all__ = ["HedgeBudget", "HedgeDelay", "HedgeLayer"]

#: latencies the delay is estimated from (the most recent GETs)
WINDOW = 256
#: GETs that must have completed before the estimate replaces ``max_delay``
MIN_SAMPLES = 20
#: new latencies between two recomputations of the percentile
RECOMPUTE_EVERY = 16
#: hedges the budget can save up
BURST = 10.0


class HedgeDelay:
    """How long a GET may go unanswered before it is hedged: the ``percentile``-th
    percentile of the last :data:`WINDOW` latencies, within ``[min_delay, max_delay]``;
    ``max_delay`` until :data:`MIN_SAMPLES` are known."""

    def __init__(self, config: HedgeConfig) -> None:
        self.config = config
        self._latencies: deque[float] = deque(maxlen=WINDOW)
        self._stale = 0
        self._delay = config.max_delay

    def observe(self, seconds: float) -> None:
        """A GET completed in ``seconds``."""
        self._latencies.append(seconds)
        self._stale += 1
        if len(self._latencies) >= MIN_SAMPLES and (
            self._stale >= RECOMPUTE_EVERY or len(self._latencies) == MIN_SAMPLES
        ):
            self._stale = 0
            estimate = percentile(self._latencies, self.config.percentile)
            assert estimate is not None  # the window is not empty
            self._delay = min(self.config.max_delay, max(self.config.min_delay, estimate))

    @property
    def seconds(self) -> float:
        return self._delay


class HedgeBudget:
    """A token bucket: each GET adds ``rate`` tokens (at most ``burst``), a hedge takes one.
    It starts with one token, so over ``n`` GETs at most ``1 + rate * n`` hedges are sent."""

    def __init__(self, rate: float, burst: float = BURST) -> None:
        self.rate = rate
        self.burst = burst
        self.tokens = 1.0

    def earn(self) -> None:
        self.tokens = min(self.burst, self.tokens + self.rate)

    def spend(self) -> bool:
        if self.tokens < 1.0:
            return False
        self.tokens -= 1.0
        return True


class HedgeLayer:
    """One attempt as up to two GETs of the same object (see the module docstring).

    ``limit`` is the client's in-flight limit: the attempt already holds one of its slots;
    a hedge takes one of its hedge slots with :meth:`AdaptiveLimit.try_acquire_hedge`.
    ``sent`` and ``won`` count hedges over the client's life.
    """

    def __init__(self, inner: Getter, limit: AdaptiveLimit, config: HedgeConfig) -> None:
        self.inner = inner
        self.limit = limit
        self.delay = HedgeDelay(config)
        self.budget = HedgeBudget(config.budget)
        self.sent = 0
        self.won = 0

    async def get(self, request: Request) -> Body:
        self.budget.earn()
        loop = asyncio.get_running_loop()
        if self.budget.tokens < 1.0 or self.limit.storming:  # no hedge: no task, no timer
            return await self._timed(request, loop)
        primary = loop.create_task(self._timed(request, loop))
        hedge: asyncio.Task[Body] | None = None
        try:
            done, _ = await asyncio.wait((primary,), timeout=self.delay.seconds)
            if done or not self._take_hedge_slot():
                return await primary
            hedge = loop.create_task(self._timed(request, loop))
            # A done callback, not a finally in the task: a task cancelled before its
            # first step never runs its body, and the slot would leak.
            hedge.add_done_callback(self._release_hedge_slot)
            self.sent += 1
            request.observer.on_hedge()
            return await self._race(request, primary, hedge)
        finally:
            children = [task for task in (primary, hedge) if task is not None]
            for task in children:
                task.cancel()  # a no-op for a finished task
            await asyncio.wait(children)
            for task in children:
                if not task.cancelled():
                    task.exception()  # retrieved: the loser's error is not news

    def _take_hedge_slot(self) -> bool:
        """A slot for a hedge if the budget, the store's mood and the limit allow one."""
        if self.limit.storming or self.budget.tokens < 1.0:
            return False
        if not self.limit.try_acquire_hedge():
            return False
        self.budget.spend()
        return True

    async def _race(
        self, request: Request, primary: asyncio.Task[Body], hedge: asyncio.Task[Body]
    ) -> Body:
        pending: set[asyncio.Task[Body]] = {primary, hedge}
        primary_error: BaseException | None = None
        while pending:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for task in sorted(done, key=lambda t: t is not primary):  # the primary first
                error = task.exception()
                if error is None:
                    if task is hedge:
                        self.won += 1
                        request.observer.on_hedge_won()
                    return task.result()
                if not (isinstance(error, FetchError) and error.retryable):
                    raise error
                if task is hedge:
                    # The first GET outlasted the delay and the hedge's whole life: most
                    # likely stalled. A fresh attempt beats waiting for it (module doc).
                    if primary_error is not None:
                        error.add_note(f"the GET it hedged failed too: {primary_error}")
                    elif primary in pending:
                        error.add_note("the GET it hedged, still unanswered, was cancelled")
                    raise error
                primary_error = error
        raise AssertionError("unreachable: the hedge's outcome ends the race")

    async def _timed(self, request: Request, loop: asyncio.AbstractEventLoop) -> Body:
        """One GET; its latency feeds the delay estimate when it succeeds."""
        started = loop.time()
        body = await self.inner.get(request)
        self.delay.observe(loop.time() - started)
        return body

    def _release_hedge_slot(self, hedge: asyncio.Task[Body]) -> None:
        self.limit.release_hedge()
