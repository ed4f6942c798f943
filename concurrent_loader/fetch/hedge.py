"""Hedged GETs: a slow GET gets one more for the same object, the first to complete wins
("The Tail at Scale", Dean and Barroso, 2013).

:class:`HedgeLayer` sits inside one attempt (below retry, limit, deadline and timing, above
the throttle accounting), so an attempt is one object to the layers above. Guarantees:

- a GET is hedged only once :class:`HedgeDelay` has passed since its send; the delay is a
  high percentile of recent latencies, a cancelled loser counting the time it ran;
- a hedge needs a :class:`HedgeBudget` token, a store that did not throttle most GETs of
  the last round, and a free hedge slot (never queued), so GETs in flight stay within
  ``limit + max_hedges_in_flight``; else the GET is looked at again one delay later;
- hedges are paced, one per ``delay / PACE`` at most, oldest GET first; a due GET is
  hedged at most ``delay / LATENESS`` late, so the watch wakes the loop at most once per
  that (not once per GET that answers near its delay);
- at most two GETs of an object in flight (a second hedge replaces the first GET); the
  first with bytes wins, the others are cancelled and awaited. An error a retry cannot
  mend, or a transient one of the youngest GET, ends the attempt at once;
- only a hedge actually sent gets a task; one timer per layer watches every attempt.
"""

from __future__ import annotations

import asyncio
import math
from collections import deque
from collections.abc import Callable
from typing import Any

from ..config import HedgeConfig
from ..errors import FetchError
from ..stores.base import Body
from .getter import Getter, Request
from .limits import AdaptiveLimit

__all__ = ["HedgeBudget", "HedgeDelay", "HedgeLayer"]

#: latencies the delay is estimated from (the most recent GETs)
WINDOW = 256
#: GETs completed before the estimate replaces ``max_delay`` (a burst's first are fastest)
MIN_SAMPLES = 64
#: new latencies between two recomputations of the percentile
RECOMPUTE_EVERY = 16
#: hedges the budget can save up
BURST = 10.0
#: hedges per attempt (the second replaces the first GET)
MAX_HEDGES = 2
#: hedges per delay at most: turns are ``delay / PACE`` apart
PACE = 4.0
#: a due GET is hedged at most ``delay / LATENESS`` late
LATENESS = 16.0
#: tokens at the start, so a process's first stalled GETs can be hedged
START_TOKENS = 5.0


class HedgeDelay:
    """How long a GET may go unanswered before it is hedged: the ``percentile``-th
    percentile of the last :data:`WINDOW` latencies, within ``[min_delay, max_delay]``;
    ``max_delay`` until :data:`MIN_SAMPLES` are known. ``on_change`` is called when it
    changes, so GETs already waiting follow the estimate."""

    def __init__(self, config: HedgeConfig, on_change: Callable[[], None] | None = None) -> None:
        self.config = config
        self._latencies: deque[float] = deque(maxlen=WINDOW)
        self._stale = 0
        self._delay = config.max_delay
        self._on_change = on_change

    def observe(self, seconds: float) -> None:
        """A GET took ``seconds`` (or at least that long, for a cancelled loser)."""
        self._latencies.append(seconds)
        self._stale += 1
        if len(self._latencies) >= MIN_SAMPLES and (
            self._stale >= RECOMPUTE_EVERY or len(self._latencies) == MIN_SAMPLES
        ):
            self._stale = 0
            ordered = sorted(self._latencies)  # the nearest rank, as metrics.percentile
            estimate = ordered[max(1, math.ceil(len(ordered) * self.config.percentile / 100)) - 1]
            delay = min(self.config.max_delay, max(self.config.min_delay, estimate))
            if delay != self._delay:
                self._delay = delay
                if self._on_change is not None:
                    self._on_change()

    @property
    def seconds(self) -> float:
        return self._delay


class HedgeBudget:
    """A token bucket: each GET adds ``rate`` tokens (at most ``burst``), a hedge takes one."""

    def __init__(self, rate: float, burst: float = BURST) -> None:
        self.rate = rate
        self.burst = burst
        self.tokens = START_TOKENS

    def earn(self) -> None:
        self.tokens = min(self.burst, self.tokens + self.rate)

    def spend(self) -> bool:
        if self.tokens < 1.0:
            return False
        self.tokens -= 1.0
        return True


class _Attempt:
    """One attempt: its first GET runs in ``owner`` (None once that GET has ended), its
    hedges in tasks of their own. ``key`` orders the watched attempts: the send of its
    youngest GET, or the last time a hedge could not be sent; it is due ``delay`` later."""

    __slots__ = (
        "cancelling",
        "cut",
        "done",
        "error",
        "hedges",
        "interrupted",
        "key",
        "owner",
        "request",
        "started",
        "wake",
    )

    def __init__(self, request: Request, owner: asyncio.Task[Any], now: float) -> None:
        self.request = request
        self.owner: asyncio.Task[Any] | None = owner
        self.cancelling = owner.cancelling()  # the caller's cancellations so far
        self.key = now
        self.started = [now]  # of each GET: the first, then the hedges
        self.hedges: list[asyncio.Task[Body]] = []
        self.done = False  # the attempt has ended: no more hedges
        self.interrupted = False  # the GET in the owner was cancelled by this layer
        self.cut: float | None = None  # when it was, because a hedge had ended
        self.error = ""  # the last transient failure, for the note of the final one
        self.wake: asyncio.Future[None] | None = None  # set when a hedge ends


class HedgeLayer:
    """One attempt as up to three GETs of the same object, at most two in flight. The
    attempt holds a slot of ``limit``; a hedge takes a hedge slot. ``sent`` and ``won``
    count hedges over the client's life."""

    def __init__(self, inner: Getter, limit: AdaptiveLimit, config: HedgeConfig) -> None:
        self.inner = inner
        self.limit = limit
        self.delay = HedgeDelay(config, on_change=self._rewatch)
        self.budget = HedgeBudget(config.budget)
        self.sent = 0
        self.won = 0
        # Attempts in flight by ``key``, oldest first (ended ones dropped at the head); the
        # timer wakes :meth:`_look` when the head is due and its turn (``_next_turn``) came.
        self._watched: deque[_Attempt] = deque()
        self._timer: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._next_turn = 0.0

    async def get(self, request: Request) -> Body:
        self.budget.earn()
        loop, owner = request.loop, request.task  # the caller's, from the attempt layer
        assert loop is not None and owner is not None
        if self.limit.storming:  # no hedge: nothing to watch
            return await self._timed(request, loop)
        started = loop.time()
        attempt = _Attempt(request, owner, started)
        self._watch(attempt, loop)
        try:
            body = await self.inner.get(request)
        except BaseException as exc:
            attempt.owner = None
            if not attempt.hedges:  # never hedged: the common case
                attempt.done = True
                raise
            return await self._settle(attempt, None, exc)
        attempt.owner = None
        if body.round_trip:
            self.delay.observe(loop.time() - started)
        if not attempt.hedges:
            attempt.done = True
            return body
        return await self._settle(attempt, body, None)

    async def _settle(
        self, attempt: _Attempt, body: Body | None, error: BaseException | None
    ) -> Body:
        """The outcome of a hedged attempt whose first GET ended with ``body`` or ``error``."""
        loop = asyncio.get_running_loop()
        owner = asyncio.current_task()
        assert owner is not None
        try:
            if attempt.interrupted:
                owner.uncancel()  # this layer's cancellation of the GET, not the caller's
                if owner.cancelling() > attempt.cancelling:  # the caller's too
                    raise error if error is not None else asyncio.CancelledError()
            elif error is not None:
                if isinstance(error, asyncio.CancelledError) or not (
                    isinstance(error, FetchError) and error.retryable
                ):
                    raise error  # the caller cancelled, the deadline passed, or final
                attempt.error = str(error)  # transient: the hedge may still answer
            if body is not None:
                self._observe_losers(attempt, loop)
                return body
            while True:
                result = self._decided(attempt, loop)
                if result is not None:
                    return result
                attempt.wake = loop.create_future()
                await attempt.wake
        finally:
            error = None  # no cycle through this frame's traceback
            attempt.done = True
            losers = [hedge for hedge in attempt.hedges if not hedge.done()]
            for hedge in losers:
                hedge.cancel()
            if losers:  # awaited, so that their slots are free when the attempt returns
                await asyncio.wait(losers)
            for hedge in attempt.hedges:
                if not hedge.cancelled():
                    hedge.exception()  # retrieved: a loser's error is not news
            attempt.hedges = []  # the watch may still hold the attempt: not its bodies

    def _decided(self, attempt: _Attempt, loop: asyncio.AbstractEventLoop) -> Body | None:
        """The winning hedge's body; raises once the attempt has failed; None meanwhile."""
        hedges = attempt.hedges
        for hedge in hedges:
            if hedge.done() and not hedge.cancelled():
                error = hedge.exception()
                if error is None:
                    self._observe_losers(attempt, loop)
                    self.won += 1
                    attempt.request.observer.on_hedge_won()
                    return hedge.result()
                if not (isinstance(error, FetchError) and error.retryable):
                    raise error
                if hedge is not hedges[-1]:
                    attempt.error = str(error)
        youngest = hedges[-1]
        if not youngest.done():
            return None
        # The youngest GET failed: one still in flight outlasted it and is likely stalled.
        error = youngest.exception()
        assert error is not None
        if attempt.error:
            error.add_note(f"the GET it hedged failed too: {attempt.error}")
        elif attempt.cut is not None or not all(hedge.done() for hedge in hedges):
            error.add_note("the GET it hedged, still unanswered, was cancelled")
        raise error

    def _observe_losers(self, attempt: _Attempt, loop: asyncio.AbstractEventLoop) -> None:
        """The attempt was won: its GETs still unanswered ran at least this long."""
        now = loop.time()
        if attempt.cut is not None:
            self.delay.observe(attempt.cut - attempt.started[0])
        for hedge, started in zip(attempt.hedges, attempt.started[1:], strict=True):
            if not hedge.done():
                self.delay.observe(now - started)

    def _interrupt(self, attempt: _Attempt) -> None:
        """Cancel the GET running in the owner's task, once (the owner uncancels once)."""
        if attempt.owner is not None and not attempt.interrupted:
            attempt.interrupted = True
            attempt.owner.cancel()

    def _hedge_ended(self, attempt: _Attempt, loop: asyncio.AbstractEventLoop) -> None:
        """A hedge ended: the owner decides, interrupted if still in its first GET."""
        self.limit.release_hedge()
        if attempt.done:
            return
        if attempt.owner is not None:
            if not attempt.interrupted:
                attempt.cut = loop.time()
                self._interrupt(attempt)
        elif attempt.wake is not None and not attempt.wake.done():
            attempt.wake.set_result(None)

    # -- watching: one timer for every attempt in flight -----------------------------------

    def _watch(self, attempt: _Attempt, loop: asyncio.AbstractEventLoop) -> None:
        """Watch ``attempt`` until it ends (what watched another loop is dropped)."""
        watched = self._watched
        if self._loop is not loop:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            watched.clear()
            self._loop = loop
            self._next_turn = 0.0
        while watched and watched[0].done:
            watched.popleft()  # ended: forgotten, so the deque stays short
        watched.append(attempt)
        if self._timer is None:
            delay = self.delay.seconds
            self._timer = loop.call_at(attempt.key + delay * (1 + 1 / LATENESS), self._look)

    def _look(self) -> None:
        """Hedge each due attempt whose turn has come; set the timer for the next."""
        self._timer = None
        loop = self._loop
        assert loop is not None
        delay = self.delay.seconds
        watched = self._watched
        while watched:
            attempt = watched[0]
            if attempt.done:
                watched.popleft()
                continue
            now = loop.time()
            due = max(attempt.key + delay, self._next_turn)
            if due > now:
                self._timer = loop.call_at(due + delay / LATENESS, self._look)
                return
            watched.popleft()
            if self._hedge(attempt, loop):
                self._next_turn = now + delay / PACE
            if len(attempt.hedges) < MAX_HEDGES:
                attempt.key = now  # no key in the deque is later: it stays in order
                watched.append(attempt)

    def _rewatch(self) -> None:
        """The delay changed: the watched attempts come due at other times."""
        timer = self._timer
        if timer is None:
            return
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            return
        if running is self._loop:
            timer.cancel()
            self._look()

    def _hedge(self, attempt: _Attempt, loop: asyncio.AbstractEventLoop) -> bool:
        """Send a hedge if budget, store and limit allow; a second replaces the first GET."""
        if self.limit.storming or self.budget.tokens < 1.0:
            return False
        if not self.limit.try_acquire_hedge():
            return False
        self.budget.spend()
        if attempt.hedges:
            self._interrupt(attempt)
        hedge = loop.create_task(self._timed(attempt.request, loop, hedge=True))
        attempt.hedges.append(hedge)
        attempt.started.append(loop.time())
        # Not a finally in the task: one cancelled before its first step runs no body.
        hedge.add_done_callback(lambda _: self._hedge_ended(attempt, loop))
        return True

    async def _timed(
        self, request: Request, loop: asyncio.AbstractEventLoop, hedge: bool = False
    ) -> Body:
        """One GET; a round trip's latency feeds the delay. A hedge counts once it starts."""
        if hedge:
            self.sent += 1
            request.observer.on_hedge()
        started = loop.time()
        body = await self.inner.get(request)
        if body.round_trip:
            self.delay.observe(loop.time() - started)
        return body
