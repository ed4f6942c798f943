"""How many GETs a process keeps in flight: a controller fed by every GET's outcome.

:class:`LimitController` decides the limit :class:`~.limits.AdaptiveLimit` enforces in
**rounds**, as TCP does per round trip: a round ends when as many GETs sent since the last
decision have ended as the limit then was, so each decision sees the effect of the one
before. At the end of each round, in this order:

1. **Queueing** (self-tuned only): a window median of :data:`WINDOW_SAMPLES` latencies over
   ``TOLERANCE`` x baseline + ``SLACK_S`` (the lowest window median of the last
   :data:`BASELINE_S` s) scales the limit down, by at most half (TCP Vegas' gradient).
   When :data:`SLOWER_STORE_CUTS` or more cuts in a row, having halved the limit, leave
   the median where the first found it (within :data:`SLOWER_STORE_SHARE`), the store got
   slower for everyone: that median is the new baseline, and slow start begins again from
   the next round (not 30 s near the floor);
2. **Growth**, when some GET waited for a slot, the limit was in use (GETs in flight
   averaged :data:`GROWTH_USE` of it or more over the round's time with any in flight: a
   pipeline that starts a batch's GETs at once while decoding sets the pace makes some
   wait in bursts, and asks for no more) and no queueing showed:
   doubling (TCP's slow start: from 64 to 512 in three rounds, not thirty) while each
   doubling raises the round's GETs per second by :data:`SLOW_START_GAIN` or more, is in
   use, and the window median stays within :data:`SLOW_START_TOLERANCE` x baseline +
   ``SLACK_S`` (TCP Vegas' early exit); the first doubling that does not pay is undone (a
   process's first round, a burst, has no rate to compare: a limit carried from the last
   epoch doubled, unchecked, every epoch). Then, after the first queueing or throttle, by
   the limit's square root (concurrency-limits' Gradient2);
   A limit less than :data:`SHRINK_USE` in use, in a round with no doubling to judge, no
   queueing and no throttle, shrinks to twice the GETs in flight on average (not below
   :data:`SHRINK_FLOOR`): what a pipeline paced by decoding or by its consumer needs,
   however high a fill at an epoch's start took it. Slow start begins again from there
   (as TCP's after idle), so a pause that shrank it costs rounds, not tens of rounds;
3. **Throttles** (503 SlowDown, 429): a cut by half the throttled fraction (as DCTCP).

The limit stays within ``[minimum, maximum]``. Self-tuned, it starts at ``start`` and
grows towards ``maximum`` while GETs wait for slots and latency holds (Little's law: at the
same latency, more GETs in flight are more GETs per second); pinned, it starts at
``maximum``, which only throttles lower. Growth waits ``cooldown`` s after a throttle. Pure
logic with an injectable clock, no event loop.
"""

from __future__ import annotations

import math
import statistics
import time
from collections import deque
from collections.abc import Callable

from ..config import SELF_TUNED_START

__all__ = ["LimitController"]

#: the lowest limit throttles or queueing may push a limit of at least this to
FLOOR = 4
#: latencies per window before its median is compared with the baseline
WINDOW_SAMPLES = 16
#: seconds of window medians the baseline is the lowest of
BASELINE_S = 30.0
#: a window median up to this multiple of the baseline is not queueing...
TOLERANCE = 2.0
#: ...nor is one up to this many seconds above it (scheduling noise)
SLACK_S = 0.005
#: slow start goes on while a doubled limit raises a round's GETs per second this much
SLOW_START_GAIN = 1.25
#: ...and a window median stays within this multiple of the baseline (plus ``SLACK_S``)
SLOW_START_TOLERANCE = 1.25
#: the limit grows only while GETs in flight average at least this share of it
GROWTH_USE = 0.5
#: a limit less than this share of which is in use shrinks to twice what is...
SHRINK_USE = 0.25
#: ...but not below 64 (the default self-tuned start)
SHRINK_FLOOR = SELF_TUNED_START
#: queueing cuts in a row after which a median still this share of the first one's...
SLOWER_STORE_CUTS = 3
#: ...means a slower store, not queueing of ours
SLOWER_STORE_SHARE = 0.8


class LimitController:
    """The limit on GETs in flight, fed :meth:`on_send` and :meth:`on_done` for each GET."""

    def __init__(
        self,
        maximum: int,
        *,
        self_tuned: bool,
        start: int | None = None,
        cooldown: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if maximum < 1:
            raise ValueError("maximum must be >= 1")
        self.maximum = maximum
        self.minimum = min(FLOOR, maximum)
        self.self_tuned = self_tuned
        if start is not None and not 1 <= start <= maximum:
            raise ValueError("start must be in [1, maximum]")
        self._value = float(start if self_tuned and start is not None else maximum)
        #: the integer limit to enforce (read on every GET, so kept, not computed)
        self.limit = max(1, int(self._value))
        self._cooldown = cooldown
        self._clock = clock
        self._sent = 0  # GETs sent so far: a GET's mark is its number
        self._round_starts_at = 0  # the first mark of the current round
        self._round_needs = self.limit  # GETs of the round that end it
        self._round_gets = 0
        self._round_throttles = 0
        # GETs in flight now, and this round's GET-seconds in flight and seconds with any
        self._in_flight = 0
        self._round_area = self._round_busy = 0.0
        self._last_event = clock()
        self._limit_bound = False
        self._slow_start = self_tuned
        self._round_began = clock()
        self._last_rate = 0.0  # the GETs per second of the last round
        self._doubled_from: float | None = None  # the value the last decision doubled
        self._cuts = 0  # queueing cuts in a row
        self._first_cut = (0.0, 0.0)  # the median and the value at the first cut in a row
        self._no_growth_until = 0.0
        self._window: list[float] = []
        # (when, window median) of the last BASELINE_S s, only those no later one is below
        # (rising medians): the baseline is the first, however many rounds the window holds
        self._medians: deque[tuple[float, float]] = deque()
        self.throttles = 0
        self.rounds = 0
        #: the fraction of the last complete round's GETs that were throttled
        self.last_throttled_fraction = 0.0

    @property
    def baseline_s(self) -> float | None:
        """The unloaded latency estimate, once a window is complete."""
        return self._medians[0][1] if self._medians else None

    def on_send(self) -> int:
        """A GET is sent; the mark to give back to :meth:`on_done`."""
        mark = self._sent
        self._sent += 1
        self._tick()
        self._in_flight += 1
        return mark

    def _tick(self) -> None:
        now = self._clock()
        if self._in_flight:
            self._round_area += self._in_flight * (now - self._last_event)
            self._round_busy += now - self._last_event
        self._last_event = now

    def limit_reached(self) -> None:
        """A GET waited for a slot (or took the last one): the limit bound this round."""
        self._limit_bound = True

    def on_done(self, mark: int, *, latency: float | None, throttled: bool = False) -> None:
        """The GET sent with ``mark`` succeeded (``latency``), was throttled, or failed."""
        self._tick()
        self._in_flight = max(0, self._in_flight - 1)
        if throttled:
            self.throttles += 1
            if self._cooldown:
                self._no_growth_until = self._clock() + self._cooldown
        elif latency is not None and self.self_tuned:
            self._window.append(latency)
        if mark < self._round_starts_at:
            return  # sent before the last decision, which it could not have seen
        self._round_gets += 1
        self._round_throttles += throttled
        if self._round_gets >= self._round_needs:
            self._end_round()

    def _end_round(self) -> None:
        self.rounds += 1
        gets, throttles = self._round_gets, self._round_throttles
        self.last_throttled_fraction = throttles / gets
        value = self._value
        queueing = rebased = False
        now = self._clock()
        seconds = max(now - self._round_began, 1e-6)
        rate, self._last_rate = self._last_rate, gets / seconds
        # GETs in flight on average while any was (a pause with none is not "unused");
        # a round that took no time cannot tell, and counts as in use
        busy = self._round_busy
        used = self._round_area / busy if busy > 0 else math.inf
        in_use = used >= GROWTH_USE * self.limit
        if self.rounds == 1:
            self._last_rate = 0.0  # one burst, shorter than later rounds: no rate to compare
        doubled, self._doubled_from = self._doubled_from, None
        paid = self._last_rate >= rate * SLOW_START_GAIN and in_use
        if doubled is not None and self._slow_start and not paid:
            self._slow_start = False  # the last doubling did not pay: undone
            value = doubled
        if len(self._window) >= WINDOW_SAMPLES:
            median = statistics.median(self._window)
            self._window.clear()
            medians = self._medians
            while medians and medians[0][0] < now - BASELINE_S:
                medians.popleft()
            while medians and medians[-1][1] >= median:
                medians.pop()
            medians.append((now, median))
            if median > SLOW_START_TOLERANCE * medians[0][1] + SLACK_S:
                self._slow_start = False
            target = TOLERANCE * medians[0][1] + SLACK_S
            if median <= target:
                self._cuts = 0
            elif self._slower_store(median):
                medians.clear()
                medians.append((now, median))
                self._slow_start = rebased = True
            else:
                value *= max(0.5, target / median)
                queueing = True
        if queueing or throttles:
            self._slow_start = False
        grows = self._limit_bound and in_use and now >= self._no_growth_until
        if grows and not (queueing or rebased):
            if self._slow_start and value < self.maximum:
                self._doubled_from = value
            value = min(
                float(self.maximum), 2 * value if self._slow_start else value + math.sqrt(value)
            )
        elif (
            self.self_tuned
            and doubled is None
            and not (queueing or rebased or throttles)
            and used < SHRINK_USE * self.limit
            and value > SHRINK_FLOOR
        ):
            value = min(value, max(float(SHRINK_FLOOR), 2 * used))
            self._slow_start = True
        if throttles:
            value *= 1.0 - self.last_throttled_fraction / 2.0
        self._value = min(float(self.maximum), max(float(self.minimum), value))
        self.limit = max(1, int(self._value))
        self._round_gets = self._round_throttles = 0
        self._round_area = self._round_busy = 0.0
        self._limit_bound = False
        self._round_starts_at = self._sent
        self._round_needs = self.limit
        self._round_began = now

    def _slower_store(self, median: float) -> bool:
        """Whether this queueing median, after the cuts in a row before it, shows a store
        that got slower for everyone: at half the GETs in flight or fewer, latency is where it
        was (Little's law: our own queueing would have halved with them)."""
        self._cuts += 1
        if self._cuts == 1:
            self._first_cut = (median, self._value)
        first_median, first_value = self._first_cut
        if (
            self._cuts <= SLOWER_STORE_CUTS
            or median < SLOWER_STORE_SHARE * first_median
            or self._value > first_value / 2
        ):
            return False
        self._cuts = 0
        return True
