"""The fetch client: a store wrapped in policies, one per (store, fetch config) per process.

A GET goes through layers, outermost first, each a :class:`Getter` around the next (each
costs a coroutine frame per wake-up, so there are few; the retry layer is entered only
after a first attempt failed)::

    RetryLayer    transient FetchErrors retried with backoff, within the object's time budget
    AttemptLayer  at most ``limit`` attempts in flight (FIFO slots); attempt timeout; timing
    HedgeLayer    one more GET for a slow one (:mod:`.hedge`; absent when hedging is off)
    OutcomeLayer  each GET's latency, throttle or failure fed to the limit's controller
    Store         one GET: bytes or a FetchError naming the object

Guarantees: ``FetchClient.get`` returns or raises within ``RetryConfig.max_total_seconds``
of the object's first send, whatever the server does. An attempt past its deadline is
cancelled (its connection closed) and raises ``FetchTimeout`` naming the object
(``ATTEMPT_TIMEOUT``, retried, or ``DEADLINE_EXCEEDED``, final). A retried object is fetched
whole again; a checksum mismatch (``IntegrityError``) is retried like an incomplete body.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import deque
from typing import Any

from ..config import FetchConfig, RetryConfig
from ..errors import FetchError, FetchTimeout, Reason, Throttled
from ..stores.base import Body, ByteRange, Store
from .getter import Getter, Request
from .hedge import HedgeLayer
from .hooks import NO_OBSERVER, FetchObserver
from .limits import AdaptiveLimit

__all__ = ["FetchClient", "Getter", "Request"]


class _Running:
    """One attempt in flight, run by ``task``: cut off at ``end`` (loop time)."""

    __slots__ = ("cancelling", "done", "end", "expired", "started", "task", "url")

    def __init__(self, task: asyncio.Task[Any], url: str, end: float) -> None:
        self.task = task
        self.cancelling = task.cancelling()  # the caller's cancellations so far
        self.url = url
        self.end = end
        self.started = time.perf_counter()
        self.done = False
        self.expired = False  # cancelled by this layer, not yet undone


class AttemptLayer:
    """At most ``limit.limit`` attempts in flight (FIFO slots), each ending ``seconds`` after
    its send (a first one also at the object's deadline, ``total`` s on; a retry's is the
    retry layer's); a success's timing goes to the observer. All get the same span, so those
    in flight, in start order, are in deadline order: one timer, for the oldest, watches all
    (``asyncio.timeout`` would arm one per GET); ended ones are dropped at the head."""

    def __init__(self, inner: Getter, limit: AdaptiveLimit, seconds: float, total: float) -> None:
        self.inner = inner
        self.limit = limit
        self.seconds = seconds
        self.total = total
        self._span = min(seconds, total)
        self._running: deque[_Running] = deque()
        self._timer: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    async def get(self, request: Request) -> Body:
        limit = self.limit
        if not limit.try_acquire():
            await limit.acquire()
        try:
            attempt = self._start(request)
            try:
                body = await self.inner.get(request)
            except asyncio.CancelledError:
                if self._uncancel(attempt):
                    raise self._expired(request) from None
                raise
            finally:
                attempt.done = True
                self._uncancel(attempt)
            request.observer.on_response(
                time.perf_counter() - attempt.started, len(body.data), body.first_byte_s
            )
            return body
        finally:
            limit.release()

    def _start(self, request: Request) -> _Running:
        # The running loop and task; no getpid (get_running_loop's) once the loop is known.
        loop = self._loop
        task = asyncio.current_task(loop) if loop is not None else None
        if task is None:
            loop = asyncio.get_running_loop()
            task = asyncio.current_task(loop)
        assert loop is not None and task is not None
        request.loop, request.task = loop, task
        running = self._running
        if loop is not self._loop:  # what was watched on another loop is dropped
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            running.clear()
            self._loop = loop
        now = loop.time()
        if request.deadline is None:
            request.deadline = now + self.total
        attempt = _Running(task, request.url, now + self._span)
        while running and running[0].done:
            running.popleft()
        running.append(attempt)
        if self._timer is None:
            self._timer = loop.call_at(attempt.end, self._expire)
        return attempt

    def _expire(self) -> None:
        """Cancel every attempt past its end; the timer is set for the next."""
        self._timer = None
        loop = self._loop
        assert loop is not None
        now = loop.time()
        running = self._running
        while running:
            attempt = running[0]
            if not attempt.done:
                if attempt.end > now:
                    self._timer = loop.call_at(attempt.end, self._expire)
                    return
                attempt.expired = True
                attempt.task.cancel()
            running.popleft()

    @staticmethod
    def _uncancel(attempt: _Running) -> bool:
        """Undo this layer's cancel, once: whether it was the only one (as asyncio.timeout)."""
        if not attempt.expired:
            return False
        attempt.expired = False
        return attempt.task.uncancel() <= attempt.cancelling

    def _expired(self, request: Request) -> FetchTimeout:
        if self.total <= self.seconds:  # the object's deadline: the retry layer says more
            return FetchTimeout(
                "no complete object in time", url=request.url, cause=Reason.DEADLINE_EXCEEDED
            )
        return FetchTimeout(
            f"no complete response within Timeouts.attempt={self.seconds:g} s",
            url=request.url,
            stage="fetch",
            cause=Reason.ATTEMPT_TIMEOUT,
        )

    def oldest(self) -> tuple[str, float] | None:
        """(object, seconds in flight) of the oldest attempt in flight, if any."""
        for attempt in list(self._running):  # one C-level copy: safe from other threads
            if not attempt.done:
                return attempt.url, time.perf_counter() - attempt.started
        return None


class OutcomeLayer:
    """Each GET (hedges included) told to the limit's controller: sent, then how it ended."""

    def __init__(self, store: Store, limit: AdaptiveLimit) -> None:
        self.store = store
        self.limit = limit

    async def get(self, request: Request) -> Body:
        mark = self.limit.sent()
        started = time.perf_counter()
        try:
            body = await self.store.get(request.key, request.byte_range)
        except Throttled:
            request.observer.on_throttle()
            self.limit.done(mark, latency=None, throttled=True)
            raise
        except BaseException:
            self.limit.done(mark, latency=None)  # cancelled or failed: no latency sample
            raise
        # A cache hit took no request: it is no sample of the store's latency.
        latency = time.perf_counter() - started if body.round_trip else None
        self.limit.done(mark, latency=latency)
        return body


class RetryLayer:
    """Retries transient errors per :class:`~concurrent_loader.config.RetryConfig`. A throttle
    does not count towards ``max_attempts``: it is retried after its backoff, or once another
    GET succeeds (after a ``Retry-After``: once it has passed, no sooner). The object's
    budget (a timer armed after a first failure) ends it with ``FetchTimeout``
    (``DEADLINE_EXCEEDED``) caused by the last failed attempt. Entered only once a first
    attempt failed: a GET that succeeds at once passes no frame of it."""

    def __init__(self, inner: Getter, config: RetryConfig, limit: AdaptiveLimit) -> None:
        self.inner = inner
        self.config = config
        self.limit = limit
        self._rng = random.Random()

    async def after(self, request: Request, error: FetchError) -> Body:
        """The body of ``request``, whose first attempt failed with ``error``."""
        retry = self.config
        loop = asyncio.get_running_loop()
        if request.deadline is None:  # failed before it was sent
            request.deadline = loop.time() + retry.max_total_seconds
        budget = asyncio.timeout_at(request.deadline)
        failures = throttles = 0
        last: FetchError | None = None  # the last failed attempt
        try:
            async with budget:
                while True:
                    if isinstance(error, FetchTimeout) and error.cause is Reason.DEADLINE_EXCEEDED:
                        raise self._out_of_time(request, failures + throttles + 1, last) from last
                    last = error
                    if isinstance(error, Throttled):
                        throttles += 1
                        delay = retry.throttle_backoff(throttles - 1, self._rng)
                        delay = max(delay, error.retry_after or 0.0)
                    else:
                        failures += 1
                        delay = retry.backoff(failures - 1, self._rng)
                    attempts = failures + throttles
                    if not error.retryable or failures >= retry.max_attempts:
                        if attempts > 1:
                            error.add_note(f"gave up after {attempts} attempts")
                        raise error
                    if loop.time() + delay >= request.deadline:
                        raise self._out_of_time(request, attempts, error) from error
                    request.observer.on_retry(error)
                    if isinstance(error, Throttled) and error.retry_after is not None:
                        await asyncio.sleep(delay)  # the server said when: no sooner
                    elif isinstance(error, Throttled):
                        await self.limit.wait_for_success(delay)
                    else:
                        await asyncio.sleep(delay)
                    try:
                        return await self.inner.get(request)
                    except FetchError as exc:
                        error = exc
        except TimeoutError as exc:
            if isinstance(exc, FetchError) or not budget.expired():
                raise
            raise self._out_of_time(request, failures + throttles + 1, last) from last

    def _out_of_time(
        self, request: Request, attempts: int, last: FetchError | None
    ) -> FetchTimeout:
        """The error for an object whose budget ran out after ``attempts`` attempts."""
        error = FetchTimeout(
            f"no complete object within RetryConfig.max_total_seconds="
            f"{self.config.max_total_seconds:g} s",
            url=request.url,
            stage="fetch",
            cause=Reason.DEADLINE_EXCEEDED,
        )
        error.add_note(f"gave up after {attempts} attempt{'s' if attempts != 1 else ''}")
        if last is not None:
            error.add_note(f"the last failed attempt: {last}")
        return error


class FetchClient:
    """Whole objects (or byte ranges) from ``store``, under ``config``'s policies. Shared by
    the process's pipelines that read the same store with the same config (cached on the
    runtime), so its limit caps the process's GETs to that store. Use it on the runtime's
    event loop."""

    def __init__(self, store: Store, config: FetchConfig, *, start: int | None = None) -> None:
        self.store = store
        self.config = config
        cap = config.inflight_cap
        self.limit = AdaptiveLimit(
            cap,
            self_tuned=config.max_inflight_requests is None,
            start=config.inflight_start if start is None else min(start, cap),
            hedges=config.max_hedges_in_flight,
            cooldown=config.retry.throttle_cooldown,
        )
        getter: Getter = OutcomeLayer(store, self.limit)
        self.hedging: HedgeLayer | None = None
        if config.hedge.enabled:
            getter = self.hedging = HedgeLayer(getter, self.limit, config.hedge)
        self._attempts = AttemptLayer(
            getter, self.limit, config.timeouts.attempt, config.retry.max_total_seconds
        )
        self._retry = RetryLayer(self._attempts, config.retry, self.limit)

    @property
    def in_flight(self) -> int:
        """GETs in flight now, hedges included."""
        return self.limit.in_flight + self.limit.hedges_in_flight

    def describe(self) -> str:
        """What this client is waiting for, in one line (read from any thread)."""
        oldest = self._attempts.oldest()
        text = f"{self.in_flight} GETs in flight (limit {self.limit.limit})"
        if oldest is not None:
            text += f", the oldest for {oldest[1]:.1f} s: {oldest[0]}"
        return text

    async def get(
        self,
        key: str,
        byte_range: ByteRange | None = None,
        *,
        observer: FetchObserver = NO_OBSERVER,
    ) -> bytes | bytearray:
        request = Request(key, byte_range, self.store.url_for(key), observer)
        try:  # not through get_body: a frame less per GET
            return (await self._attempts.get(request)).data
        except FetchError as exc:
            error = exc  # retried outside the handler: no first error as the last's context
        return (await self._retry.after(request, error)).data

    async def get_body(
        self,
        key: str,
        byte_range: ByteRange | None = None,
        *,
        observer: FetchObserver = NO_OBSERVER,
    ) -> Body:
        """Like :meth:`get`, with what the store said of the body (ETag, object checksum)."""
        request = Request(key, byte_range, self.store.url_for(key), observer)
        try:
            return await self._attempts.get(request)
        except FetchError as exc:
            error = exc
        return await self._retry.after(request, error)

    async def close(self) -> None:
        await self.store.close()

    def __repr__(self) -> str:
        pinned = self.config.max_inflight_requests
        inflight = pinned if pinned is not None else f"self-tuned up to {self.limit.maximum}"
        return f"FetchClient({self.store!r}, max_inflight_requests={inflight})"
