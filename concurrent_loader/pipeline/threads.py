"""How many decode threads a process runs: a hill climb fed by the decode stage itself.

:class:`ThreadController` sees every decode job end (its seconds, and whether another sample
was waiting for a thread when it began) and decides in **rounds** of at least
:data:`ROUND_S` s and two jobs per thread, so each decision sees the effect of the one
before (tf.data's AUTOTUNE climbs the same way, one step of parallelism at a time). A round
starts with a job: the first one's, or the first after no job ended for :data:`ROUND_S` s
(a pause, an epoch's end), so idle time never counts as slow decoding. At the end of a
round, with ``n`` threads:

1. a **probe** (one thread added the round before) stays only if the round's decodes per
   second rose by :data:`GAIN` ``/ n`` (half of what one more thread adds when a core is
   free for it), and at least :data:`MIN_GAIN`; else it is undone, and the count before it
   is the ceiling for :data:`HOLD_S` s (then probed again, so a changed regime is found);
2. else, when decoding is the bottleneck (samples waited for a thread at
   :data:`BOTTLENECK` or more of the round's jobs, and the threads were busy ``(n - 1/2) /
   n`` of it or more: a burst of arrivals alone is not a bottleneck), one thread more is
   probed, within the ceiling and ``maximum`` (the process's share of the loader's
   ``cpu_budget``);
3. else, when the threads were busy less than ``(n - 1) / n - IDLE_MARGIN`` of the round,
   one thread less (at least one).

Threads beyond the cores that are free add no decodes per second, so the climb stops where
the CPU is; while the fetch stage or the consumer sets the pace the threads idle, so they
are given back. Pure logic with an injectable clock, no threads.
"""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ["ThreadController"]

#: a round lasts at least this many seconds...
ROUND_S = 0.5
#: ...and two decode jobs per thread
JOBS_PER_THREAD = 2
#: a probe from n threads must raise decodes per second by this share of 1 / n...
GAIN = 0.5
#: ...and by this share at least (rounds' rates vary by a few per cent)
MIN_GAIN = 0.03
#: decoding is the bottleneck when at least this share of a round's jobs found a sample
#: waiting behind the one they took (and the threads were busy)
BOTTLENECK = 0.5
#: a thread is idle when the busy share is this far below (n - 1) / n
IDLE_MARGIN = 0.1
#: seconds an unpaid probe's count stays the ceiling
HOLD_S = 10.0


class ThreadController:
    """Decode threads between 1 and ``maximum``, starting at ``start``."""

    def __init__(
        self, start: int, maximum: int, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if not 1 <= start <= maximum:
            raise ValueError(f"need 1 <= start <= maximum, got {start} and {maximum}")
        self.threads = start
        self.maximum = maximum
        self._clock = clock
        self._ceiling = maximum
        self._ceiling_until = 0.0
        self._probe: tuple[int, float] | None = None  # (threads before it, their rate)
        self._started: float | None = None  # the round's start: none before the first job
        self._last_end = 0.0

    def _begin(self, now: float) -> None:
        self._started = now
        self._jobs = 0
        self._waited = 0
        self._busy_s = 0.0

    def observe(self, seconds: float, waited: bool) -> int:
        """One decode job of ``seconds`` ended; ``waited``: another sample waited for a
        thread when it began. Returns the threads to run now."""
        now = self._clock()
        began = now - seconds
        started = self._started
        if started is None or began - self._last_end > ROUND_S:
            started = began  # the first job, or the first after an idle spell
            self._begin(started)
        self._last_end = max(self._last_end, now)
        self._jobs += 1
        self._waited += waited
        self._busy_s += seconds
        elapsed = now - started
        if elapsed >= ROUND_S and self._jobs >= JOBS_PER_THREAD * self.threads:
            self._decide(now, elapsed)
            self._begin(now)
        return self.threads

    def _decide(self, now: float, elapsed: float) -> None:
        rate = self._jobs / elapsed
        if self._probe is not None:
            before, before_rate = self._probe
            self._probe = None
            if rate < before_rate * (1 + max(GAIN / before, MIN_GAIN)):
                self.threads = before
                self._ceiling, self._ceiling_until = before, now + HOLD_S
            return
        if now >= self._ceiling_until:
            self._ceiling = self.maximum
        n = self.threads
        busy = self._busy_s / (elapsed * n)
        bottleneck = self._waited >= BOTTLENECK * self._jobs and busy >= (n - 0.5) / n
        if bottleneck and n < self._ceiling:
            self._probe = (n, rate)
            self.threads = n + 1
        elif n > 1 and busy < (n - 1) / n - IDLE_MARGIN:
            self.threads = n - 1
