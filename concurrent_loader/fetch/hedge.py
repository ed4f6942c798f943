"""Hedged GETs: a slow GET gets one more for the same object, and the first to complete wins.

After "The Tail at Scale" (Dean and Barroso, 2013). :class:`HedgeLayer` sits inside one
attempt, below the retry, limit, deadline and timing layers and above the per-GET throttle
accounting, so:

- the hedge timer starts when the attempt is sent (it holds its request slot), never while
  it waits for one; the delay is :class:`HedgeDelay`'s estimate (a high percentile of this
  client's recent GET latencies, within a floor and a ceiling, followed as it changes; a
  cancelled loser counts with the time it ran, a lower bound: leaving it out would hide
  the very tail the estimate is for, so the percentile would sink and hedge ever more
  GETs);
- a hedge is sent only if the budget (:class:`HedgeBudget`) has a token, the store did
  not throttle most GETs of the last round, and one of the limit's hedge slots is free at
  once: a hedge never queues, and it does not take one of the limit's slots, because the
  GET it overtakes holds one and the limit may be small (a throttling store cuts it): a
  hedge that waited for a slot behind its own stalled GET would never be sent. At most
  ``FetchConfig.max_hedges_in_flight`` hedges are in flight beyond the limit, so the GETs
  in flight stay within ``limit + max_hedges_in_flight`` (the transport's connection cap);
- hedges are paced: at most one per ``delay / PACE`` seconds (:data:`PACE`); GETs that
  come due meanwhile wait their turn, oldest first. This tells a queue from a tail: a
  burst of GETs that only queue at the store (the first round of a process, sent at
  once) passes the delay together and mostly completes within a fraction of it, while a
  stalled GET is still unanswered when its turn comes. Unpaced, such a burst took the
  budget's tokens in one instant and left none for the stalls among it;
- at most one hedge per attempt. The first of the two to return bytes wins; the other is
  cancelled (the transport closes a cancelled connection) and awaited, so its slot is
  free again when the attempt returns. An error that a retry cannot mend (404, 403, ...)
  from either ends the attempt at once. A transient error of the first GET waits for the
  hedge; a transient error of the hedge ends the attempt with it (and the first GET is
  cancelled), because the first GET has outlasted the delay and the hedge's whole life,
  so it is most likely stalled: the retry layer sends a fresh attempt after its backoff,
  rather than waiting for the stall to end or for ``Timeouts.read``;
- a GET runs in its caller's task: only a late one gets a race, a task of its own that
  sends its hedge and waits for the first of the two (until then, one timer per layer
  watches every GET not late yet, oldest first). Most GETs answer within the delay, and a
  task and a race around each one cost more CPU than the rest of the fetch client's
  layers. To cancel the GET in the caller's task, the race cancels that task, which tells
  this cancellation from its own caller's (``Task.uncancel``, as ``asyncio.timeout`` does);
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
import contextvars
from collections import deque
from collections.abc import Callable, Coroutine
from typing import Any

from ..config import HedgeConfig
from ..errors import FetchError
from ..metrics.percentile import percentile
from ..stores.base import Body
from .getter import Getter, Request
from .limits import AdaptiveLimit

__all__ = ["HedgeBudget", "HedgeDelay", "HedgeLayer"]

#: latencies the delay is estimated from (the most recent GETs)
WINDOW = 256
#: GETs that must have completed before the estimate replaces ``max_delay``: a whole first
#: round at the default in-flight cap, because the first GETs of a burst to complete are its
#: fastest (the rest queue at the store), and an estimate from them alone is so low that it
#: spends the hedge budget on that burst's ordinary GETs, leaving none for its stalls
MIN_SAMPLES = 64
#: new latencies between two recomputations of the percentile
RECOMPUTE_EVERY = 16
#: hedges the budget can save up
BURST = 10.0
#: hedges per attempt: a second one only when the first is as late, and it replaces the
#: primary, so an object has at most two GETs in flight
MAX_HEDGES = 2
#: hedges per delay at most (see the module docstring): turns are ``delay / PACE`` apart
PACE = 4.0
#: tokens at the start: a process's first GETs, some stalled before enough latencies are
#: known, are hedged without waiting for tokens that only GETs can earn
START_TOKENS = 5.0


class HedgeDelay:
    """How long a GET may go unanswered before it is hedged: the ``percentile``-th
    percentile of the last :data:`WINDOW` latencies, within ``[min_delay, max_delay]``;
    ``max_delay`` until :data:`MIN_SAMPLES` are known. A GET waiting for its hedge follows
    the estimate as it changes (:meth:`changed`), so the GETs sent first, before any
    latency was known, are not left with ``max_delay``."""

    def __init__(self, config: HedgeConfig, on_change: Callable[[], None] | None = None) -> None:
        self.config = config
        self._latencies: deque[float] = deque(maxlen=WINDOW)
        self._stale = 0
        self._delay = config.max_delay
        self._changed: asyncio.Future[None] | None = None
        self._on_change = on_change

    def changed(self) -> asyncio.Future[None]:
        """A future done when the delay next changes (on the running loop)."""
        loop = asyncio.get_running_loop()
        if self._changed is None or self._changed.done() or self._changed.get_loop() is not loop:
            self._changed = loop.create_future()
        return self._changed

    def observe(self, seconds: float) -> None:
        """A GET took ``seconds`` (or at least that long, for a cancelled loser)."""
        self._latencies.append(seconds)
        self._stale += 1
        if len(self._latencies) >= MIN_SAMPLES and (
            self._stale >= RECOMPUTE_EVERY or len(self._latencies) == MIN_SAMPLES
        ):
            self._stale = 0
            estimate = percentile(self._latencies, self.config.percentile)
            assert estimate is not None  # the window is not empty
            delay = min(self.config.max_delay, max(self.config.min_delay, estimate))
            if delay != self._delay:
                self._delay = delay
                if self._on_change is not None:
                    self._on_change()
                changed, self._changed = self._changed, None
                if (
                    changed is not None
                    and not changed.done()
                    and not changed.get_loop().is_closed()
                ):
                    changed.set_result(None)

    @property
    def seconds(self) -> float:
        return self._delay


class HedgeBudget:
    """A token bucket: each GET adds ``rate`` tokens (at most ``burst``), a hedge takes one.
    It starts with :data:`START_TOKENS`, so over ``n`` GETs at most
    ``START_TOKENS + rate * n`` hedges are sent."""

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


class _Race:
    """One attempt and what is known of it.

    Until its GET is late, an attempt is only this record: the GET runs in the caller's own
    task (``owner``), with no task or timer of its own. Once late, a task of its own
    (``racer``, :meth:`HedgeLayer._race`) runs the race: ``gets`` holds the GET's outcome
    as a future (``gets[0]``, completed by the owner) and each hedge as a task, oldest
    first. Cancelling that future (:meth:`cancel`) cancels the GET running in the owner."""

    __slots__ = (
        "context",
        "error",
        "gets",
        "granted",
        "interrupted",
        "owner",
        "owner_cancelling",
        "racer",
        "request",
        "retry_at",
        "settled",
        "started",
    )

    def __init__(
        self,
        request: Request,
        owner: asyncio.Task[Any],
        started: float,
        context: contextvars.Context,
    ) -> None:
        self.request = request
        self.owner: asyncio.Task[Any] | None = owner  # None once its GET has answered
        self.owner_cancelling = owner.cancelling()
        self.context = context  # the caller's: the racer runs in it
        self.racer: asyncio.Task[Body] | None = None
        self.interrupted = False  # the race cancelled the GET running in the owner
        self.gets: list[asyncio.Future[Body]] = []
        self.started: list[float] = [started]  # of each GET, the first one's first
        self.settled: set[asyncio.Future[Body]] = set()
        self.error: BaseException | None = None  # the primary's transient failure
        self.retry_at = 0.0  # no hedge before this (none could be sent at the last try)
        self.granted = False  # its turn to hedge came (see HedgeLayer._turn)

    def start(self, get: Coroutine[Any, Any, Body], loop: asyncio.AbstractEventLoop) -> None:
        """Run ``get`` as the attempt's next GET (in a copy of the racer's context)."""
        self.gets.append(loop.create_task(get))
        self.started.append(loop.time())

    def cancel(self, get: asyncio.Future[Body]) -> None:
        """Cancel one of ``gets``; the first is the GET in the owner's task, cancelled
        there (the owner tells this cancellation from its caller's, see
        :meth:`HedgeLayer._join`)."""
        if get.cancel() and get is self.gets[0] and self.owner is not None:
            self.interrupted = True
            self.owner.cancel()

    @property
    def youngest_started(self) -> float:
        return self.started[-1]


async def _first_done(
    futures: list[asyncio.Future[Any]], timeout: float | None, loop: asyncio.AbstractEventLoop
) -> None:
    """Until one of ``futures`` is done or ``timeout`` seconds have passed: what
    ``asyncio.wait(..., return_when=FIRST_COMPLETED)`` does, without the sets and the
    checks it builds on every call (this runs for every wait of a late GET)."""
    if not futures:
        raise ValueError("nothing to wait for")
    waiter = loop.create_future()

    def wake(_: object = None) -> None:
        if not waiter.done():
            waiter.set_result(None)

    handle = loop.call_later(timeout, wake) if timeout is not None else None
    for future in futures:
        future.add_done_callback(wake)
    try:
        await waiter
    finally:
        if handle is not None:
            handle.cancel()
        for future in futures:
            future.remove_done_callback(wake)


class HedgeLayer:
    """One attempt as up to two GETs of the same object (see the module docstring).

    ``limit`` is the client's in-flight limit: the attempt already holds one of its slots;
    a hedge takes one of its hedge slots with :meth:`AdaptiveLimit.try_acquire_hedge`.
    ``sent`` and ``won`` count hedges over the client's life.
    """

    def __init__(self, inner: Getter, limit: AdaptiveLimit, config: HedgeConfig) -> None:
        self.inner = inner
        self.limit = limit
        self.delay = HedgeDelay(config, on_change=self._rewatch)
        self.budget = HedgeBudget(config.budget)
        self.sent = 0
        self.won = 0
        # Attempts whose GET is not late yet, in the order they were sent (so in the order
        # they come due), answered ones left in place until they reach the head; one timer
        # (``_watch_timer``) wakes :meth:`_look` when the oldest comes due.
        self._unanswered: deque[_Race] = deque()
        self._watch_timer: asyncio.TimerHandle | None = None
        self._watch_loop: asyncio.AbstractEventLoop | None = None
        # Attempts due for a hedge that wait their turn, each with the future that wakes
        # it; the next turn is not before ``_next_turn``, and ``_turn_timer`` gives it.
        self._waiting: dict[_Race, asyncio.Future[None]] = {}
        self._next_turn = 0.0
        self._turn_timer: asyncio.TimerHandle | None = None
        self._turn_loop: asyncio.AbstractEventLoop | None = None

    async def get(self, request: Request) -> Body:
        self.budget.earn()
        loop = asyncio.get_running_loop()
        if self.limit.storming:  # no hedge: nothing to watch
            return await self._timed(request, loop)
        # The GET runs here, in the caller's task: most GETs answer within the delay, and
        # a task per GET to race it against a hedge that is never sent costs more CPU than
        # the rest of this layer. A late GET gets its race (:meth:`_look`).
        owner = asyncio.current_task()
        assert owner is not None  # a coroutine awaited on a running loop
        race = _Race(request, owner, loop.time(), contextvars.copy_context())
        self._watch(race, loop)
        try:
            body, error = await self._outcome(request, loop)
        finally:
            race.owner = None  # answered: the race cannot cancel it any more
        if race.racer is None:  # never late: the common case
            if error is not None:
                try:
                    raise error
                finally:
                    error = None  # no cycle through this frame's traceback
            assert body is not None  # no error: a body
            return body
        return await self._join(race, error, body)

    async def _outcome(
        self, request: Request, loop: asyncio.AbstractEventLoop
    ) -> tuple[Body | None, BaseException | None]:
        """The GET's body or what it raised (the race, if any, decides what that means).
        Caught here, not in :meth:`get`: a traceback through :meth:`get`'s frame would hold
        the race, and with it the winning body, in a cycle until the collector ran."""
        try:
            return await self._timed(request, loop), None
        except BaseException as exc:
            return None, exc

    async def _join(self, race: _Race, error: BaseException | None, body: Body | None) -> Body:
        """The owner's GET of a late attempt ended (``error`` or ``body``): hand its outcome
        to the race and return the race's, unless the caller itself was cancelled."""
        racer = race.racer
        assert racer is not None
        owner = asyncio.current_task()
        assert owner is not None
        if race.interrupted:
            owner.uncancel()  # the race's own cancellation of the GET, not the caller's
        if isinstance(error, asyncio.CancelledError) and (
            not race.interrupted or owner.cancelling() > race.owner_cancelling
        ):
            # The caller was cancelled (or the attempt's deadline passed): so is the race,
            # awaited so that its hedge's slot is free when the attempt ends.
            racer.cancel()
            await asyncio.wait([racer])
            if not racer.cancelled():
                racer.exception()  # retrieved: the attempt's outcome is the cancellation
            try:
                raise error
            finally:
                error = None  # no cycle through this frame's traceback
        primary = race.gets[0]
        if not primary.done():
            if error is not None:
                primary.set_exception(error)
            else:
                assert body is not None
                primary.set_result(body)
        return await racer

    # -- watching: one timer for every GET not late yet ------------------------------------

    def _watch(self, race: _Race, loop: asyncio.AbstractEventLoop) -> None:
        """Watch ``race``'s GET until it answers or comes due (a timer left on another loop,
        one that ended, is dropped with the attempts it watched)."""
        unanswered = self._unanswered
        if self._watch_loop is not loop:
            if self._watch_timer is not None:
                self._watch_timer.cancel()
                self._watch_timer = None
            unanswered.clear()
            self._watch_loop = loop
        while unanswered and unanswered[0].owner is None:
            unanswered.popleft()  # answered: forgotten, so the deque stays short
        unanswered.append(race)
        if self._watch_timer is None:
            self._watch_timer = loop.call_at(race.started[0] + self.delay.seconds, self._look)

    def _look(self) -> None:
        """The oldest watched GET may be due: each one that is, still unanswered, gets its
        race; the timer is set again for the next one."""
        self._watch_timer = None
        loop = self._watch_loop
        assert loop is not None
        now = loop.time()
        delay = self.delay.seconds
        unanswered = self._unanswered
        while unanswered:
            race = unanswered[0]
            if race.owner is not None:
                due = race.started[0] + delay
                if due > now:
                    self._watch_timer = loop.call_at(due, self._look)
                    return
                race.gets.append(loop.create_future())
                race.racer = loop.create_task(self._race(race, loop), context=race.context)
            unanswered.popleft()

    def _rewatch(self) -> None:
        """The delay changed: the watched GETs come due at other times. (A timer left on
        another loop, or one that ended, is replaced by the next :meth:`_watch` there.)"""
        timer = self._watch_timer
        if timer is None:
            return
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            return
        if running is self._watch_loop:
            timer.cancel()
            self._look()

    async def _race(self, race: _Race, loop: asyncio.AbstractEventLoop) -> Body:
        """A late attempt: hedge it when its turn comes and the budget allows, until one of
        its GETs succeeds or the attempt fails (see the module docstring)."""
        request = race.request
        try:
            while True:
                body = self._settle(request, race, loop)
                if body is not None:
                    return body
                remaining = None
                turn = None
                if len(race.gets) <= MAX_HEDGES:
                    due = max(race.youngest_started + self.delay.seconds, race.retry_at)
                    remaining = due - loop.time()
                    if remaining <= 0:
                        turn = self._turn(race, loop)
                        if turn is None:
                            self._hedge(request, race, loop)
                            continue
                        remaining = None  # it waits for its turn, not for a time
                    elif race.granted:  # the delay grew: no longer due, the turn passes
                        self._pass_turn(race, loop)
                waits: list[asyncio.Future[Any]] = [t for t in race.gets if not t.done()]
                if turn is not None:
                    waits.append(turn)
                elif remaining is not None:
                    waits.append(self.delay.changed())  # the timer follows the estimate
                await _first_done(waits, remaining, loop)
        finally:
            self._leave(race, loop)
            for get in race.gets:
                if not get.done():
                    race.cancel(get)
            # Cancelled hedges are awaited, so their slots are free when the attempt returns
            # (the first GET ends in the owner's task, which awaits this race).
            losers = [get for get in race.gets[1:] if not get.done()]
            if losers:
                await asyncio.wait(losers)
            for get in race.gets:
                if not get.cancelled():
                    get.exception()  # retrieved: the loser's error is not news

    # -- turns: hedges paced delay / PACE apart, oldest attempt first ----------------------

    def _turn(self, race: _Race, loop: asyncio.AbstractEventLoop) -> asyncio.Future[None] | None:
        """None if ``race``, due, may hedge now; else the future that wakes it for its turn."""
        if race.granted or (not self._waiting and loop.time() >= self._next_turn):
            race.granted = False
            return None
        turn = self._waiting.get(race)
        if turn is None or turn.done():
            turn = self._waiting[race] = loop.create_future()
        self._wind_turns(loop)
        return turn

    def _wind_turns(self, loop: asyncio.AbstractEventLoop) -> None:
        """Have the next turn given when it comes, if an attempt waits for it (a timer
        left on another loop, one that ended, is replaced)."""
        timer = self._turn_timer
        if timer is not None and self._turn_loop is not loop:
            timer.cancel()
            timer = self._turn_timer = None
        if self._waiting and timer is None:
            self._turn_timer = loop.call_at(self._next_turn, self._give_turn)
            self._turn_loop = loop

    def _give_turn(self) -> None:
        """The next turn came: it goes to the oldest waiting attempt."""
        self._turn_timer = None
        if not self._waiting:
            return
        race = min(self._waiting, key=lambda r: r.youngest_started)
        turn = self._waiting.pop(race)
        race.granted = True
        if not turn.done():
            turn.set_result(None)

    def _pass_turn(self, race: _Race, loop: asyncio.AbstractEventLoop) -> None:
        """``race`` was given a turn it does not use: the next waiting attempt has it."""
        race.granted = False
        self._wind_turns(loop)

    def _leave(self, race: _Race, loop: asyncio.AbstractEventLoop) -> None:
        """The attempt ended: it waits for no turn, and one it was given passes on."""
        self._waiting.pop(race, None)
        if race.granted:
            self._pass_turn(race, loop)

    def _hedge(self, request: Request, race: _Race, loop: asyncio.AbstractEventLoop) -> None:
        """The youngest GET outlasted the delay and it is its turn: send a hedge if allowed
        (the next turn is then ``delay / PACE`` away). When the first hedge is itself that
        late, the primary (the oldest, most likely stalled) is cancelled, so an object
        never has more than two GETs in flight."""
        if not self._take_hedge_slot():
            # No token or hedge slot now: look again one delay later (a timer per late
            # GET, not a poll), rather than leave a stalled GET to its read timeout. The
            # turn passes to the next waiting attempt at once.
            race.retry_at = loop.time() + self.delay.seconds
            self._wind_turns(loop)
            return
        self._next_turn = loop.time() + self.delay.seconds / PACE
        self._wind_turns(loop)
        primary = race.gets[0]
        if len(race.gets) > 1 and not primary.done():
            race.cancel(primary)
        race.start(self._timed(request, loop), loop)
        # A done callback, not a finally in the task: a task cancelled before its first
        # step never runs its body, and the slot would leak.
        race.gets[-1].add_done_callback(self._release_hedge_slot)
        self.sent += 1
        request.observer.on_hedge()

    def _settle(
        self, request: Request, race: _Race, loop: asyncio.AbstractEventLoop
    ) -> Body | None:
        """The winner's body once one GET succeeded; raises once the attempt has failed
        (see the module docstring); None while it goes on."""
        primary = race.gets[0]
        for task in race.gets:
            if not task.done() or task in race.settled:
                continue
            race.settled.add(task)
            if task.cancelled():
                continue  # a primary replaced by a second hedge
            error = task.exception()
            if error is None:
                for loser, started in zip(race.gets, race.started, strict=True):
                    if not loser.done():  # it ran at least this long: a lower bound
                        self.delay.observe(loop.time() - started)
                if task is not primary:
                    self.won += 1
                    request.observer.on_hedge_won()
                return task.result()
            if not (isinstance(error, FetchError) and error.retryable):
                raise error
            younger = race.gets[race.gets.index(task) + 1 :]
            if all(t.done() for t in younger):
                # No younger GET to wait for: any still in flight is older, has outlasted
                # the delay and this GET's whole life, and is most likely stalled, so a
                # fresh attempt beats waiting for it.
                if race.error is not None:
                    error.add_note(f"the GET it hedged failed too: {race.error}")
                elif not all(t.done() for t in race.gets):
                    error.add_note("the GET it hedged, still unanswered, was cancelled")
                raise error
            race.error = error
        return None

    def _take_hedge_slot(self) -> bool:
        """A slot for a hedge if the budget, the store's mood and the limit allow one."""
        if self.limit.storming or self.budget.tokens < 1.0:
            return False
        if not self.limit.try_acquire_hedge():
            return False
        self.budget.spend()
        return True

    async def _timed(self, request: Request, loop: asyncio.AbstractEventLoop) -> Body:
        """One GET; its latency feeds the delay estimate when it succeeds (a cache hit sent
        no request: its time is no sample of the store's latency)."""
        started = loop.time()
        body = await self.inner.get(request)
        if body.round_trip:
            self.delay.observe(loop.time() - started)
        return body

    def _release_hedge_slot(self, hedge: asyncio.Future[Body]) -> None:
        self.limit.release_hedge()
