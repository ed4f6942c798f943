"""The fetch client: a store wrapped in policies, one per (store, fetch config) per process.

A GET goes through layers, outermost first, each a :class:`Getter` around the next (a new
policy is one more wrapper; a cache is a store wrapper below them all; each layer costs a
coroutine frame per wake-up, so there are few)::

    RetryLayer    transient FetchErrors retried with backoff, within the object's time budget
    AttemptLayer  at most ``limit`` attempts in flight (FIFO slots); attempt timeout; timing
    HedgeLayer    one more GET for a slow one (:mod:`.hedge`; absent when hedging is off)
    OutcomeLayer  each GET's latency, throttle or failure fed to the limit's controller
    Store         one GET: bytes or a FetchError naming the object

Guarantees: ``FetchClient.get`` returns or raises within ``RetryConfig.max_total_seconds``
of the object's first send (not of its wait for a slot), whatever the server does (stalls,
trickles, never answers). An attempt past its deadline is cancelled (the transport closes
the connection) and raises :class:`~concurrent_loader.errors.FetchTimeout` naming the
object: ``Reason.ATTEMPT_TIMEOUT`` (retried) or ``Reason.DEADLINE_EXCEEDED`` (final). A
retried object is fetched whole again, never stitched from a partial body; a checksum
mismatch (``IntegrityError`` from the store) is retried like an incomplete body.
"""

from __future__ import annotations

import asyncio
import random
import time

from ..config import FetchConfig, RetryConfig
from ..errors import FetchError, FetchTimeout, Reason, Throttled
from ..stores.base import Body, ByteRange, Store
from .getter import Getter, Request
from .hedge import HedgeLayer
from .hooks import NO_OBSERVER, FetchObserver
from .limits import AdaptiveLimit

__all__ = ["FetchClient", "Getter", "Request"]


class AttemptLayer:
    """At most ``limit.limit`` attempts in flight, each waiting (FIFO) for a slot. One timer
    ends an attempt at the sooner of ``seconds`` (``Timeouts.attempt``) after its send and
    the object's deadline (set at its first send, ``total`` seconds ahead). A success's
    duration, size and time to first byte go to the observer; the attempts in flight
    (object and start) are kept for stall reports."""

    def __init__(self, inner: Getter, limit: AdaptiveLimit, seconds: float, total: float) -> None:
        self.inner = inner
        self.limit = limit
        self.seconds = seconds
        self.total = total
        self.in_flight: dict[int, tuple[str, float]] = {}

    async def get(self, request: Request) -> Body:
        await self.limit.acquire()
        token = id(request)
        try:
            now = asyncio.get_running_loop().time()
            deadline = request.deadline
            if deadline is None:
                deadline = request.deadline = now + self.total
            end = min(now + self.seconds, deadline)
            started = time.perf_counter()
            self.in_flight[token] = (request.url, started)
            timeout = asyncio.timeout_at(end)
            try:
                async with timeout:
                    body = await self.inner.get(request)
            except TimeoutError as exc:
                if isinstance(exc, FetchError) or not timeout.expired():
                    raise
                raise self._expired(request, end >= deadline) from None
            request.observer.on_response(
                time.perf_counter() - started, len(body.data), body.first_byte_s
            )
            return body
        finally:
            self.in_flight.pop(token, None)
            self.limit.release()

    def _expired(self, request: Request, object_deadline: bool) -> FetchTimeout:
        if object_deadline:  # the retry layer says more
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
        attempts = list(self.in_flight.values())  # one C-level copy: safe from other threads
        if not attempts:
            return None
        url, started = min(attempts, key=lambda item: item[1])
        return url, time.perf_counter() - started


class OutcomeLayer:
    """Each GET (hedges included) is marked as sent to the limit's controller and its
    outcome told to it: its latency when it succeeds, a throttle (also told to the
    observer), or a failure. The controller lowers or raises the limit from these."""

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
    """Retries transient errors per :class:`~concurrent_loader.config.RetryConfig`.

    A failure counts towards ``max_attempts``; a throttle does not: it is retried after the
    throttle backoff, or as soon as another GET to the store succeeds, while the object's
    time budget lasts (the limit, cut by the throttles, paces those retries). The budget's
    timer is armed here only after a first failure, so a GET answered at once has none.
    However the budget runs out, the object fails with ``FetchTimeout``
    (``Reason.DEADLINE_EXCEEDED``) whose ``__cause__`` is the last failed attempt's error.
    """

    def __init__(self, inner: Getter, config: RetryConfig, limit: AdaptiveLimit) -> None:
        self.inner = inner
        self.config = config
        self.limit = limit
        self._rng = random.Random()

    async def get(self, request: Request) -> Body:
        try:
            return await self.inner.get(request)
        except FetchError as exc:
            error = exc
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
                    else:
                        failures += 1
                        delay = retry.backoff(failures - 1, self._rng)
                    attempts = failures + throttles
                    if not error.retryable or failures >= retry.max_attempts:
                        if attempts > 1:
                            error.add_note(f"gave up after {attempts} attempts")
                        raise error
                    if loop.time() + delay >= request.deadline:
                        # The retry could not start in time: out of time, as below.
                        raise self._out_of_time(request, attempts, error) from error
                    request.observer.on_retry(error)
                    if isinstance(error, Throttled):
                        # A store that accepts GETs again needs no more waiting: the
                        # limit, cut by the throttles, paces the retries.
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
        """The error for an object whose time budget ran out after ``attempts`` attempts
        (the last one perhaps cut off); ``last`` is the last one that failed."""
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
    """Whole objects (or byte ranges) from ``store``, under ``config``'s policies.

    Shared by every pipeline of a process that reads the same store with the same config
    (it is cached on the runtime), so its limit caps the process's GETs to that store.
    Use it on the runtime's event loop.
    """

    def __init__(self, store: Store, config: FetchConfig) -> None:
        self.store = store
        self.config = config
        self.limit = AdaptiveLimit(
            config.inflight_cap,
            self_tuned=config.max_inflight_requests is None,
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
        self._getter: Getter = RetryLayer(self._attempts, config.retry, self.limit)

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
        return (await self._getter.get(request)).data  # not through get_body: a frame less

    async def get_body(
        self,
        key: str,
        byte_range: ByteRange | None = None,
        *,
        observer: FetchObserver = NO_OBSERVER,
    ) -> Body:
        """Like :meth:`get`, with what the store said of the body (its ETag, and for a
        range the whole object's checksum, which the caller checks once it has the whole)."""
        request = Request(key, byte_range, self.store.url_for(key), observer)
        return await self._getter.get(request)

    async def close(self) -> None:
        await self.store.close()

    def __repr__(self) -> str:
        pinned = self.config.max_inflight_requests
        inflight = pinned if pinned is not None else f"self-tuned up to {self.limit.maximum}"
        return f"FetchClient({self.store!r}, max_inflight_requests={inflight})"
