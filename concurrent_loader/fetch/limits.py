"""The limits of one process's fetching: :class:`AdaptiveLimit` (GETs in flight) and
:class:`ByteBudget` (bytes held or expected). Both wake waiters in FIFO order through
futures, never by polling."""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from collections.abc import Callable

from .tuning import LimitController

__all__ = ["AdaptiveLimit", "ByteBudget"]


class AdaptiveLimit:
    """At most ``limit`` attempts in flight (what a :class:`~.tuning.LimitController`
    decides); up to ``hedges`` hedged GETs go beyond it and never wait. Invariant:
    ``in_flight <= max(limit, in_flight at the last cut)`` and ``hedges_in_flight <=
    hedges``, so at most ``maximum + hedges`` GETs are in flight. Use from one loop."""

    def __init__(
        self,
        maximum: int,
        *,
        self_tuned: bool = False,
        start: int | None = None,
        hedges: int = 0,
        cooldown: float = 0.0,
    ) -> None:
        if maximum < 1:
            raise ValueError("maximum must be >= 1")
        if hedges < 0:
            raise ValueError("hedges must be >= 0")
        self.controller = LimitController(
            maximum, self_tuned=self_tuned, start=start, cooldown=cooldown
        )
        self.maximum = maximum
        self.hedges = hedges
        self.in_flight = 0
        self.hedges_in_flight = 0
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._success: asyncio.Future[None] | None = None

    @property
    def limit(self) -> int:
        return self.controller.limit

    @property
    def throttles(self) -> int:
        return self.controller.throttles

    @property
    def storming(self) -> bool:
        """Whether the store throttled most GETs of the last round (then no hedging)."""
        return self.controller.last_throttled_fraction >= 0.5

    def try_acquire(self) -> bool:
        """Take a free slot now, if there is one and nobody waits for one."""
        if self.in_flight < self.limit and not self._waiters:
            self.in_flight += 1
            if self.in_flight >= self.limit:
                self.controller.limit_reached()
            return True
        return False

    async def acquire(self) -> None:
        if self.try_acquire():
            return
        self.controller.limit_reached()
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self.release()  # we were handed a slot we will not use
            else:
                self._waiters.remove(waiter)
            raise

    def try_acquire_hedge(self) -> bool:
        if self.hedges_in_flight < self.hedges:
            self.hedges_in_flight += 1
            return True
        return False

    def release_hedge(self) -> None:
        self.hedges_in_flight -= 1

    def sent(self) -> int:
        """A GET (attempt or hedge) is sent: its mark for :meth:`done`."""
        return self.controller.on_send()

    def done(self, mark: int, *, latency: float | None, throttled: bool = False) -> None:
        """The GET sent with ``mark`` ended (:meth:`LimitController.on_done`)."""
        self.controller.on_done(mark, latency=latency, throttled=throttled)
        if latency is not None and self._success is not None:
            success, self._success = self._success, None
            if not success.done() and not success.get_loop().is_closed():
                success.set_result(None)
        self._admit()

    async def wait_for_success(self, seconds: float) -> None:
        """Wait ``seconds``, or less if a GET succeeds first."""
        loop = asyncio.get_running_loop()
        if self._success is None or self._success.get_loop() is not loop:
            self._success = loop.create_future()
        await asyncio.wait((self._success,), timeout=seconds)

    def release(self) -> None:
        """Give an attempt's slot back."""
        self.in_flight -= 1
        self._admit()

    def _admit(self) -> None:
        while self._waiters and self.in_flight < self.limit:
            waiter = self._waiters.popleft()
            if not waiter.done():
                self.in_flight += 1
                waiter.set_result(None)
        if self._waiters:
            self.controller.limit_reached()  # GETs still wait, into the round now going


class ByteBudget:
    """Bytes fetched and not yet decoded, plus those expected of the GETs in flight, stay
    within ``max_bytes``. :meth:`reserve` waits (FIFO) until the expected size fits (the
    listed ``size_hint``, else the mean so far, else the whole budget); :meth:`settle` holds
    it, :meth:`release` frees it from any thread. With nothing committed one is always
    admitted. Invariant: ``held + reserved`` is what is committed, changed under the lock."""

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
            if not self._waiters:
                expected = self._expected(size_hint)
                if self._fits(expected):
                    self.reserved += expected
                    return expected
            waiter: asyncio.Future[int] = asyncio.get_running_loop().create_future()
            self._waiters.append((waiter, size_hint))
        try:
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
