"""The limits of one process's fetching: requests in flight, and bytes held.

:class:`AdaptiveLimit` caps the GETs in flight and backs off when the store throttles;
:class:`ByteBudget` caps the bytes fetched but not yet decoded, plus those expected of the
GETs in flight. Both wake waiters in FIFO order through futures, never by polling.

``AdaptiveLimit`` admits at most ``limit`` holders at once. ``limit`` starts at (and never
exceeds) ``maximum``; a throttle halves it (not below 1) and it grows back by one each time a
request completes without throttling after the cool-down, so a loader under 503 SlowDown
does not amplify the overload (additive increase, multiplicative decrease). Waiters are
woken in FIFO order by futures, never by polling; :meth:`AdaptiveLimit.try_acquire` takes a
slot only when one is free and nobody waits (a hedged GET never queues). Loop-bound: use
from one event loop.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from collections.abc import Callable

__all__ = ["AdaptiveLimit", "ByteBudget"]


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

    def try_acquire(self) -> bool:
        """Take a slot if one is free and nobody waits for one; never waits."""
        if self.in_flight < self.limit and not self._waiters:
            self.in_flight += 1
            return True
        return False

    @property
    def cooling_down(self) -> bool:
        """Whether the store throttled within the cool-down (the limit does not grow)."""
        return time.monotonic() < self._quiet_after

    def throttle(self) -> None:
        """The store throttled a request: halve the limit and start the cool-down."""
        self.throttles += 1
        self.limit = max(1, self.limit // 2)
        self._quiet_after = time.monotonic() + self._cooldown

    def release(self, *, throttled: bool = False) -> None:
        """Give a slot back; ``throttled`` when its request was (the same as
        :meth:`throttle` first). Otherwise the limit grows by one after the cool-down."""
        if throttled:
            self.throttle()
        elif self.limit < self.maximum and not self.cooling_down:
            self.limit += 1
        self._release_slot()

    def _release_slot(self) -> None:
        self.in_flight -= 1
        while self._waiters and self.in_flight < self.limit:
            waiter = self._waiters.popleft()
            if not waiter.done():
                self.in_flight += 1
                waiter.set_result(None)


class ByteBudget:
    """Bytes fetched and not yet decoded, plus those expected of the GETs in flight, stay
    within ``max_bytes``.

    Before a GET, :meth:`reserve` waits (FIFO) until the object's expected size fits: its
    size when the listing told it (``size_hint``), else the mean size so far, else (before
    the first body) the whole budget, so the very first GET goes alone. When the body
    arrives, :meth:`settle` turns the reservation into held bytes, which :meth:`release`
    frees from any thread once decoded. One reservation is always admitted when nothing is
    committed, so an object larger than the budget still loads; one larger than its
    estimate may overshoot it.

    Invariant: ``held + reserved`` is what is committed; both only change under the lock.
    ``reserve`` runs on the event loop; ``release`` may run on any thread and wakes the loop
    through ``call_soon`` (``loop.call_soon_threadsafe``).
    """

    def __init__(self, max_bytes: int, call_soon: Callable[[Callable[[], None]], None]) -> None:
        if max_bytes < 1:
            raise ValueError("max_bytes must be >= 1")
        self.max_bytes = max_bytes
        self.held = 0
        self.reserved = 0
        self._total = 0
        self._count = 0
        self._call_soon = call_soon
        self._lock = threading.Lock()
        # (future, size_hint) per waiting reserve(), in arrival order
        self._waiters: deque[tuple[asyncio.Future[int], int | None]] = deque()
        self._closed = False

    def _expected(self, size_hint: int | None) -> int:
        if size_hint is not None:
            return size_hint
        return self._total // self._count if self._count else self.max_bytes

    def _fits(self, expected: int) -> bool:
        committed = self.held + self.reserved
        return committed == 0 or committed + expected <= self.max_bytes

    async def reserve(self, size_hint: int | None = None) -> int:
        """Wait until one more body fits; return the bytes reserved for it."""
        with self._lock:
            # Checked and queued under the lock that releases take, so a release cannot
            # slip between the check and the queueing unnoticed.
            if not self._waiters:
                expected = self._expected(size_hint)
                if self._fits(expected):
                    self.reserved += expected
                    return expected
            waiter: asyncio.Future[int] = asyncio.get_running_loop().create_future()
            self._waiters.append((waiter, size_hint))
        try:
            # Granted by _grant with the bytes already reserved: nobody can take them
            # between the grant and this task's turn of the loop.
            return await waiter
        except asyncio.CancelledError:
            with self._lock:
                for entry in self._waiters:
                    if entry[0] is waiter:
                        self._waiters.remove(entry)
                        break
            if waiter.done() and not waiter.cancelled():
                self.cancel(waiter.result())  # granted, but nobody will use it
            raise

    def cancel(self, reserved: int) -> None:
        """The GET failed or was cancelled: give its reservation back (on the loop)."""
        with self._lock:
            self.reserved -= reserved
        self._grant()

    def settle(self, reserved: int, size: int) -> None:
        """The body of ``size`` bytes arrived for a reservation of ``reserved`` (on the loop)."""
        with self._lock:
            self.reserved -= reserved
            self.held += size
            self._total += size
            self._count += 1
        self._grant()

    def release(self, size: int) -> None:
        """From any thread: a body of ``size`` bytes is decoded (or dropped)."""
        with self._lock:
            self.held -= size
            wake = bool(self._waiters) and not self._closed
        if wake:
            self._call_soon(self._grant)

    def close(self) -> None:
        """Admit every waiter (on the loop): the pipeline is closing."""
        with self._lock:
            self._closed = True
        self._grant()

    def _grant(self) -> None:
        """Admit waiters in FIFO order while the one at the head fits (on the loop)."""
        with self._lock:
            waiters = self._waiters
            while waiters:
                waiter, size_hint = waiters[0]
                if waiter.done():
                    waiters.popleft()
                    continue
                expected = self._expected(size_hint)
                if not (self._closed or self._fits(expected)):
                    return
                waiters.popleft()
                self.reserved += expected
                waiter.set_result(expected)
