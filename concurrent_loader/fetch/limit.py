"""A limit on requests in flight that backs off when the store throttles.

``AdaptiveLimit`` admits at most ``limit`` holders at once. ``limit`` starts at (and never
exceeds) ``maximum``; a throttle halves it (not below 1) and it grows back by one each time a
request completes without throttling after the cool-down, so a loader under 503 SlowDown
does not amplify the overload (additive increase, multiplicative decrease). Waiters are
woken in FIFO order by futures, never by polling. Loop-bound: use from one event loop.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque

__all__ = ["AdaptiveLimit"]


class AdaptiveLimit:
    def __init__(self, maximum: int, *, cooldown: float = 5.0) -> None:
        if maximum < 1:
            raise ValueError("maximum must be >= 1")
        self.maximum = maximum
        self.limit = maximum
        self.in_flight = 0
        self.throttles = 0
        self._cooldown = cooldown
        self._quiet_after = 0.0
        self._waiters: deque[asyncio.Future[None]] = deque()

    async def acquire(self) -> None:
        if self.in_flight < self.limit and not self._waiters:
            self.in_flight += 1
            return
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self._release_slot()  # we were handed a slot we will not use
            else:
                self._waiters.remove(waiter)
            raise

    def release(self, *, throttled: bool = False) -> None:
        if throttled:
            self.throttles += 1
            self.limit = max(1, self.limit // 2)
            self._quiet_after = time.monotonic() + self._cooldown
        elif self.limit < self.maximum and time.monotonic() >= self._quiet_after:
            self.limit += 1
        self._release_slot()

    def _release_slot(self) -> None:
        self.in_flight -= 1
        while self._waiters and self.in_flight < self.limit:
            waiter = self._waiters.popleft()
            if not waiter.done():
                self.in_flight += 1
                waiter.set_result(None)
