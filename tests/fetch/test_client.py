"""The fetch client's layers over the in-memory store: retry, the in-flight limit, timing.

Retries are made instant (``base_delay=0``) or deterministic (:class:`FixedBackoff`), and
concurrency is read from the store's own record of GETs in flight, never from the clock.
"""

from __future__ import annotations

import asyncio
import pickle
import random
import time
from collections.abc import Callable
from dataclasses import dataclass

import pytest
from _observers import Recorder

from concurrent_loader.config import FetchConfig, HedgeConfig, RetryConfig, Timeouts
from concurrent_loader.errors import (
    AccessDenied,
    BadRequest,
    ConnectionFailed,
    FetchError,
    FetchTimeout,
    IncompleteBody,
    ObjectNotFound,
    Reason,
    ServerError,
    Throttled,
)
from concurrent_loader.fetch import NO_OBSERVER, FetchClient, FetchObserver
from concurrent_loader.fetch.tuning import FLOOR
from concurrent_loader.stores import ByteRange
from concurrent_loader.stores.base import Body
from concurrent_loader.testing.memory import STALL, MemoryConfig

URL = "memory://test/a"

TRANSIENT: list[tuple[type[FetchError], Reason]] = [
    (Throttled, Reason.THROTTLED),
    (ServerError, Reason.SERVER_ERROR),
    (ConnectionFailed, Reason.CONNECTION_RESET),
    (FetchTimeout, Reason.READ_TIMEOUT),
    (IncompleteBody, Reason.INCOMPLETE_BODY),
]
PERMANENT: list[tuple[type[FetchError], Reason]] = [
    (ObjectNotFound, Reason.NOT_FOUND),
    (AccessDenied, Reason.ACCESS_DENIED),
    (BadRequest, Reason.BAD_REQUEST),
]


@dataclass(frozen=True)
class FixedBackoff(RetryConfig):
    """Every retry waits exactly ``base_delay`` (after a throttle ``throttle_base_delay``):
    deadlines become deterministic."""

    def backoff(self, retry: int, rng: random.Random) -> float:
        return self.base_delay

    def throttle_backoff(self, retry: int, rng: random.Random) -> float:
        return self.throttle_base_delay


def failing(
    cls: type[FetchError], reason: Reason, times: int | None = None
) -> Callable[[str, int], object]:
    """A script failing the first ``times`` attempts (all when None), a new error each time."""

    def script(key: str, attempt: int) -> object:
        if times is None or attempt < times:
            return cls(f"attempt {attempt}", url=f"memory://test/{key}", cause=reason)
        return None

    return script


INSTANT = RetryConfig(base_delay=0.0, throttle_base_delay=0.0)


def make_client(
    config: MemoryConfig, retry: RetryConfig | None = None, **fetch: int
) -> FetchClient:
    fetch_config = FetchConfig(retry=retry or INSTANT, **fetch)
    return FetchClient(config.open(fetch_config), fetch_config)


def fetch(client: FetchClient, key: str = "a", observer: FetchObserver = NO_OBSERVER) -> bytes:
    async def main() -> bytes:
        return bytes(await client.get(key, observer=observer))

    return asyncio.run(main())


# ---------------------------------------------------------------------------- retry


@pytest.mark.parametrize(("cls", "reason"), TRANSIENT)
def test_transient_error_is_retried_until_it_succeeds(cls, reason):
    store = MemoryConfig({"a": b"payload"}, script=failing(cls, reason, times=2))
    observer = Recorder()
    assert fetch(make_client(store), observer=observer) == b"payload"
    assert store.stats.gets["a"] == 3
    assert [type(e) for e in observer.retries] == [cls, cls]
    assert len(observer.responses) == 1
    assert observer.throttles == (2 if cls is Throttled else 0)


FAILURES = [(cls, reason) for cls, reason in TRANSIENT if cls is not Throttled]


@pytest.mark.parametrize(("cls", "reason"), FAILURES)
def test_failure_is_raised_after_max_attempts(cls, reason):
    store = MemoryConfig({"a": b"payload"}, script=failing(cls, reason))
    observer = Recorder()
    client = make_client(store, RetryConfig(base_delay=0.0, max_attempts=4))
    with pytest.raises(cls) as caught:
        fetch(client, observer=observer)
    error = caught.value
    assert store.stats.gets["a"] == 4
    assert len(observer.retries) == 3
    assert observer.responses == []
    assert error.url == URL and error.cause is reason
    assert "gave up after 4 attempts" in getattr(error, "__notes__", [])


def test_one_attempt_allowed_means_no_retry_and_no_note():
    store = MemoryConfig({"a": b"x"}, script=failing(ServerError, Reason.SERVER_ERROR))
    client = make_client(store, RetryConfig(base_delay=0.0, max_attempts=1))
    with pytest.raises(ServerError) as caught:
        fetch(client)
    assert store.stats.gets["a"] == 1
    assert not getattr(caught.value, "__notes__", [])


@pytest.mark.parametrize(("cls", "reason"), PERMANENT)
def test_permanent_error_is_not_retried(cls, reason):
    store = MemoryConfig({"a": b"x"}, script=failing(cls, reason))
    observer = Recorder()
    with pytest.raises(cls) as caught:
        fetch(make_client(store), observer=observer)
    assert store.stats.gets["a"] == 1
    assert observer.retries == []
    assert caught.value.url == URL and caught.value.cause is reason
    assert not getattr(caught.value, "__notes__", [])


def test_missing_object_is_not_retried():
    store = MemoryConfig({})
    with pytest.raises(ObjectNotFound) as caught:
        fetch(make_client(store), "gone")
    assert store.stats.gets["gone"] == 1
    assert caught.value.url == "memory://test/gone"


def test_permanent_error_after_retries_notes_the_attempts():
    def script(key: str, attempt: int) -> object:
        if attempt == 0:
            return ServerError("first", url=URL, cause=Reason.SERVER_ERROR)
        return AccessDenied("then", url=URL, cause=Reason.ACCESS_DENIED)

    store = MemoryConfig({"a": b"x"}, script=script)
    with pytest.raises(AccessDenied) as caught:
        fetch(make_client(store))
    assert store.stats.gets["a"] == 2
    assert "gave up after 2 attempts" in caught.value.__notes__
    # The first attempt's error (and the frames it holds, a body perhaps) is not chained on.
    assert caught.value.__context__ is None


def test_errors_that_are_not_fetch_errors_are_not_retried():
    store = MemoryConfig({"a": b"x"}, script=lambda key, attempt: RuntimeError("a bug"))
    with pytest.raises(RuntimeError, match="a bug"):
        fetch(make_client(store))
    assert store.stats.gets["a"] == 1


def test_deadline_shorter_than_the_first_backoff_stops_at_once():
    store = MemoryConfig({"a": b"x"}, script=failing(ServerError, Reason.SERVER_ERROR))
    retry = FixedBackoff(base_delay=60.0, max_attempts=10, max_total_seconds=0.5)
    observer = Recorder()
    with pytest.raises(FetchTimeout) as caught:
        fetch(make_client(store, retry), observer=observer)
    assert store.stats.gets["a"] == 1
    assert observer.retries == []
    error = caught.value
    assert error.cause is Reason.DEADLINE_EXCEEDED and error.url == URL
    assert "max_total_seconds=0.5 s" in str(error)
    assert "gave up after 1 attempt" in error.__notes__
    assert isinstance(error.__cause__, ServerError)


def test_deadline_stops_retries_before_max_attempts():
    # Attempts start at >= 0, 0.1, 0.2 s; the third's backoff would end past 0.25 s.
    store = MemoryConfig({"a": b"x"}, script=failing(ServerError, Reason.SERVER_ERROR))
    retry = FixedBackoff(base_delay=0.1, max_attempts=100, max_total_seconds=0.25)
    observer = Recorder()
    with pytest.raises(FetchTimeout) as caught:
        fetch(make_client(store, retry), observer=observer)
    gets = store.stats.gets["a"]
    assert 2 <= gets <= 3
    assert len(observer.retries) == gets - 1
    assert caught.value.cause is Reason.DEADLINE_EXCEEDED
    assert f"gave up after {gets} attempts" in caught.value.__notes__
    assert isinstance(caught.value.__cause__, ServerError)


def test_backoff_is_full_jitter_capped_by_max_delay():
    config = RetryConfig(base_delay=0.1, max_delay=1.0)
    rng = random.Random(7)
    for retry, cap in [(0, 0.1), (1, 0.2), (2, 0.4), (3, 0.8), (4, 1.0), (10, 1.0)]:
        delays = [config.backoff(retry, rng) for _ in range(200)]
        assert all(0.0 <= d <= cap for d in delays)
        assert max(delays) > cap / 2  # spread over the whole range, not a fixed delay
    assert RetryConfig(base_delay=0.0).backoff(5, rng) == 0.0


def test_throttle_backoff_is_longer_full_jitter_capped_by_its_own_maximum():
    config = RetryConfig()
    assert config.throttle_base_delay > config.base_delay
    rng = random.Random(3)
    for retry, cap in [(0, 0.5), (1, 1.0), (3, 4.0), (5, 10.0), (200, 10.0)]:
        delays = [config.throttle_backoff(retry, rng) for _ in range(200)]
        assert all(0.0 <= d <= cap for d in delays)
        assert max(delays) > cap / 2


# ---------------------------------------------------------------------------- throttling


def test_throttles_do_not_count_against_max_attempts():
    store = MemoryConfig({"a": b"payload"}, script=failing(Throttled, Reason.THROTTLED, times=12))
    observer = Recorder()
    client = make_client(store, RetryConfig(max_attempts=1, throttle_base_delay=0.0))
    assert fetch(client, observer=observer) == b"payload"
    assert store.stats.gets["a"] == 13
    assert observer.throttles == 12 and len(observer.retries) == 12


def test_failures_between_throttles_still_count_against_max_attempts():
    def script(key: str, attempt: int) -> object:
        if attempt % 2 == 0:
            return Throttled("slow", url=URL, cause=Reason.THROTTLED)
        return ServerError("boom", url=URL, cause=Reason.SERVER_ERROR)

    store = MemoryConfig({"a": b"x"}, script=script)
    with pytest.raises(ServerError) as caught:
        fetch(make_client(store, RetryConfig(max_attempts=3, **ZERO_DELAYS)))
    # throttle, failure, throttle, failure, throttle, failure: the third failure ends it
    assert store.stats.gets["a"] == 6
    assert "gave up after 6 attempts" in caught.value.__notes__


def test_a_store_that_never_stops_throttling_fails_when_the_time_budget_is_spent():
    store = MemoryConfig({"a": b"x"}, script=failing(Throttled, Reason.THROTTLED))
    retry = FixedBackoff(max_attempts=1, throttle_base_delay=0.05, max_total_seconds=0.3)
    observer = Recorder()
    with pytest.raises(FetchTimeout) as caught:
        fetch(make_client(store, retry), observer=observer)
    # retries start at 0.05, 0.10, ... and none may start at or past 0.3 s
    assert 4 <= store.stats.gets["a"] <= 6
    assert observer.throttles == store.stats.gets["a"]
    assert caught.value.cause is Reason.DEADLINE_EXCEEDED
    assert isinstance(caught.value.__cause__, Throttled)


ZERO_DELAYS = {"base_delay": 0.0, "throttle_base_delay": 0.0}


class Storm:
    """A store script: every GET is throttled until ``seconds`` after the first one."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.ends: float | None = None
        self.throttled = 0

    def __call__(self, key: str, attempt: int) -> object:
        now = time.monotonic()
        if self.ends is None:
            self.ends = now + self.seconds
        if now < self.ends:
            self.throttled += 1
            return Throttled("SlowDown", url=f"memory://test/{key}", cause=Reason.THROTTLED)
        return 0.001


def scaled(config: RetryConfig, factor: float) -> RetryConfig:
    """``config`` with every duration multiplied by ``factor`` (the attempt counts kept)."""
    return RetryConfig(
        max_attempts=config.max_attempts,
        base_delay=config.base_delay * factor,
        max_delay=config.max_delay * factor,
        throttle_base_delay=config.throttle_base_delay * factor,
        throttle_max_delay=config.throttle_max_delay * factor,
        max_total_seconds=config.max_total_seconds * factor,
        throttle_cooldown=config.throttle_cooldown * factor,
    )


def test_a_30_s_slowdown_storm_loses_nothing_with_the_default_settings():
    # The default RetryConfig and a 30 s storm, with every duration scaled by 1/30: 1 s.
    factor = 1 / 30
    storm = Storm(30 * factor)
    objects = {f"{i:03d}": f"body {i}".encode() for i in range(400)}
    during, after = list(objects)[:200], list(objects)[200:]
    store = MemoryConfig(objects, script=storm)
    client = make_client(store, scaled(RetryConfig(), factor), max_inflight_requests=16)
    observer = Recorder()
    lowest: list[int] = []
    recovered: list[int] = []

    async def main() -> list[bytes]:
        async def watch(into: list[int]) -> None:
            while True:
                into.append(client.limit.limit)
                await asyncio.sleep(0.01)

        async def wave(keys: list[str], into: list[int]) -> list[bytes]:
            watcher = asyncio.create_task(watch(into))
            try:
                got = await asyncio.gather(*(client.get(k, observer=observer) for k in keys))
            finally:
                watcher.cancel()
            into.append(client.limit.limit)
            return [bytes(b) for b in got]

        # Every object of the first wave is throttled; the second comes after the storm,
        # all at once, so GETs wait for slots: the limit has a reason to grow back.
        return await wave(during, lowest) + await wave(after, recovered)

    assert asyncio.run(main()) == list(objects.values())
    assert storm.throttled > len(during)  # every object was throttled, most more than once
    assert observer.throttles == storm.throttled
    assert len(observer.responses) == len(objects)
    assert min(lowest) == FLOOR  # the in-flight limit backed off to its floor ...
    assert max(recovered) > FLOOR, recovered  # ... and grew back once the storm was over
    assert client.in_flight == 0


def test_a_one_second_slowdown_burst_loses_nothing_with_the_unscaled_defaults():
    storm = Storm(1.0)
    objects = {f"{i:03d}": f"body {i}".encode() for i in range(20)}
    store = MemoryConfig(objects, script=storm)
    client = FetchClient(store.open(FetchConfig()), FetchConfig())

    async def main() -> list[bytes]:
        return [bytes(b) for b in await asyncio.gather(*(client.get(k) for k in objects))]

    assert asyncio.run(main()) == list(objects.values())
    assert storm.throttled >= len(objects)


# ---------------------------------------------------------------------------- deadlines


def deadline_client(
    store: MemoryConfig, attempt: float, budget: float, **fetch: int
) -> FetchClient:
    config = FetchConfig(
        timeouts=Timeouts(attempt=attempt),
        retry=RetryConfig(max_attempts=100, base_delay=0.0, max_total_seconds=budget),
        **fetch,
    )
    return FetchClient(store.open(config), config)


def test_an_attempt_that_never_ends_is_cut_off_and_retried():
    store = MemoryConfig(
        {"a": b"payload"}, script=lambda key, attempt: STALL if attempt == 0 else None
    )
    observer = Recorder()
    assert fetch(deadline_client(store, 0.05, 5.0), observer=observer) == b"payload"
    assert store.stats.gets["a"] == 2
    (error,) = observer.retries
    assert isinstance(error, FetchTimeout) and error.cause is Reason.ATTEMPT_TIMEOUT
    assert error.url == URL and "Timeouts.attempt=0.05 s" in str(error)


@pytest.mark.parametrize("answer", [STALL, 30.0], ids=["stall", "slow"])
def test_the_time_budget_holds_when_no_attempt_ever_ends(answer):
    store = MemoryConfig({"a": b"x"}, script=lambda key, attempt: answer)
    client = deadline_client(store, 0.1, 0.35)
    started = time.monotonic()
    with pytest.raises(FetchTimeout) as caught:
        fetch(client)
    elapsed = time.monotonic() - started
    error = caught.value
    assert error.cause is Reason.DEADLINE_EXCEEDED and error.url == URL
    assert error.stage == "fetch"
    assert "max_total_seconds=0.35 s" in str(error)
    # Cut off at 0.1, 0.2 and 0.3 s, the fourth at 0.35 s (on a loaded machine, the
    # third may already be cut off by the budget).
    gets = store.stats.gets["a"]
    assert gets in (3, 4)
    assert f"gave up after {gets} attempts" in error.__notes__
    assert isinstance(error.__cause__, FetchTimeout)
    assert error.__cause__.cause is Reason.ATTEMPT_TIMEOUT
    assert elapsed < 0.35 + 1.0  # generous against a loaded machine; unbounded without it
    assert client.in_flight == 0 and store.stats.in_flight == 0


def test_an_object_with_one_slow_attempt_fails_at_the_budget_not_the_attempt_timeout():
    store = MemoryConfig({"a": b"x"}, latency_s=30.0)
    with pytest.raises(FetchTimeout) as caught:
        fetch(deadline_client(store, 60.0, 0.1))
    assert caught.value.cause is Reason.DEADLINE_EXCEEDED
    assert store.stats.gets["a"] == 1
    assert "gave up after 1 attempt" in caught.value.__notes__
    assert caught.value.__cause__ is None  # no attempt failed before


def test_waiting_for_the_first_request_slot_does_not_spend_the_budget():
    # One slot; each GET takes 0.1 s, within the 0.25 s budget, but the last of five waits
    # 0.4 s for the slot before it is sent.
    store = MemoryConfig({f"{i}": b"x" for i in range(5)}, latency_s=0.1)
    client = deadline_client(store, 60.0, 0.25, max_inflight_requests=1)
    _gather(client, [f"{i}" for i in range(5)])
    assert store.stats.total == 5


class CountingLoop(asyncio.SelectorEventLoop):
    """Counts the timers armed on it (``asyncio.timeout`` arms its timer with call_at)."""

    timers = 0

    def call_at(self, when, callback, *args, context=None):  # type: ignore[no-untyped-def]
        self.timers += 1
        return super().call_at(when, callback, *args, context=context)


@pytest.mark.parametrize(("hedged", "timers"), [(False, 1), (True, 2)])
def test_a_get_answered_at_once_arms_the_attempts_timer_and_no_retry_timer(hedged, timers):
    # The attempt's deadline (and, hedged, the hedge watch's) only: the object's time
    # budget gets a timer of its own after a first failure.
    store = MemoryConfig({"a": b"x"})
    config = FetchConfig(retry=INSTANT, hedge=HedgeConfig(enabled=hedged))
    client = FetchClient(store.open(config), config)
    loop = CountingLoop()
    try:
        assert bytes(loop.run_until_complete(client.get("a"))) == b"x"
    finally:
        loop.close()
    assert loop.timers == timers


def test_a_retry_waiting_for_a_slot_is_held_to_the_budget():
    # "a" fails after 50 ms; its retry waits for the only slot, which "b" took meanwhile
    # and holds, stalled: the budget (armed at the failure, from the first send) cuts it.
    class Store:
        capabilities = MemoryConfig({}).capabilities

        def __init__(self) -> None:
            self.gets: list[str] = []

        def url_for(self, key: str) -> str:
            return f"memory://test/{key}"

        async def get(self, key: str, byte_range: ByteRange | None = None) -> Body:
            self.gets.append(key)
            if key == "b":
                await asyncio.Event().wait()
            await asyncio.sleep(0.05)
            raise ServerError("boom", url=self.url_for(key), cause=Reason.SERVER_ERROR)

        async def close(self) -> None:
            pass

    store = Store()
    config = FetchConfig(
        retry=RetryConfig(base_delay=0.0, max_total_seconds=0.2), max_inflight_requests=1
    )
    client = FetchClient(store, config)

    async def main() -> None:
        first = asyncio.create_task(client.get("a"))
        await asyncio.sleep(0)  # "a" holds the slot, "b" waits for it
        blocker = asyncio.create_task(client.get("b"))
        started = asyncio.get_running_loop().time()
        with pytest.raises(FetchTimeout) as caught:
            await first
        assert asyncio.get_running_loop().time() - started < 0.2 + 0.5
        error = caught.value
        assert error.cause is Reason.DEADLINE_EXCEEDED
        assert isinstance(error.__cause__, ServerError)
        assert store.gets == ["a", "b"]
        blocker.cancel()
        with pytest.raises(asyncio.CancelledError):
            await blocker
        assert client.in_flight == 0

    asyncio.run(main())


def test_an_error_past_the_budget_pickles_with_its_reason():
    store = MemoryConfig({"a": b"x"}, script=lambda key, attempt: STALL)
    with pytest.raises(FetchTimeout) as caught:
        fetch(deadline_client(store, 60.0, 0.05))
    back = pickle.loads(pickle.dumps(caught.value))
    assert type(back) is FetchTimeout and back.cause is Reason.DEADLINE_EXCEEDED
    assert back.url == URL and str(back) == str(caught.value)


# ---------------------------------------------------------------------------- limit


def _gather(client: FetchClient, keys: list[str], observer: FetchObserver = NO_OBSERVER) -> None:
    async def main() -> None:
        await asyncio.gather(*(client.get(k, observer=observer) for k in keys))
        assert client.in_flight == 0

    asyncio.run(main())


@pytest.mark.parametrize("limit", [1, 3, 8])
def test_requests_in_flight_reach_but_never_exceed_the_limit(limit):
    store = MemoryConfig({f"{i}": b"x" for i in range(30)}, latency_s=0.002)
    _gather(make_client(store, max_inflight_requests=limit), [f"{i}" for i in range(30)])
    assert store.stats.max_in_flight == limit
    assert store.stats.total == 30


def _throttle_hot_once(key: str, attempt: int) -> object:
    if key.startswith("hot") and attempt == 0:
        return Throttled("slow down", url=f"memory://test/{key}", cause=Reason.THROTTLED)
    return None


HOT = {f"hot{i}": b"x" for i in range(8)}


def test_a_round_of_throttles_halves_the_limit_once_and_the_cooldown_holds_it():
    objects = {f"{i}": b"x" for i in range(30)} | HOT
    store = MemoryConfig(objects, latency_s=0.002, script=_throttle_hot_once)
    client = make_client(
        store,
        RetryConfig(base_delay=0.0, throttle_base_delay=0.0, throttle_cooldown=3600.0),
        max_inflight_requests=8,
    )
    observer = Recorder()
    _gather(client, list(HOT), observer)  # 8 GETs in flight, every one throttled once
    assert observer.throttles == 8 and len(observer.retries) == 8
    assert client.limit.limit == 4 and client.limit.throttles == 8  # one cut, not eight
    store.stats.max_in_flight = 0
    _gather(client, [f"{i}" for i in range(30)])
    assert store.stats.max_in_flight == 4  # within the cool-down: no growth
    assert client.limit.limit == 4


def test_the_limit_grows_back_without_a_cooldown_once_throttles_stop():
    objects = {f"{i}": b"x" for i in range(60)} | HOT
    store = MemoryConfig(objects, latency_s=0.002, script=_throttle_hot_once)
    client = make_client(
        store, RetryConfig(base_delay=0.0, throttle_base_delay=0.0), max_inflight_requests=8
    )

    async def main() -> None:
        await asyncio.gather(*(client.get(k) for k in HOT))
        assert client.limit.throttles == 8 and client.limit.limit < 8
        store.stats.max_in_flight = 0
        await asyncio.gather(*(client.get(f"{i}") for i in range(60)))
        assert client.limit.limit == 8  # never above the maximum

    asyncio.run(main())
    assert store.stats.max_in_flight == 8


def test_cancelled_gets_give_their_slots_back():
    stall = {"stalled"}
    store = MemoryConfig(
        {"stalled": b"x", "a": b"y"}, script=lambda key, attempt: STALL if key in stall else None
    )
    client = make_client(store, max_inflight_requests=1)

    async def main() -> None:
        holder = asyncio.create_task(client.get("stalled"))
        waiter = asyncio.create_task(client.get("a"))
        for _ in range(10):
            await asyncio.sleep(0)
        assert store.stats.in_flight == 1 and not waiter.done()
        waiter.cancel()
        holder.cancel()
        await asyncio.gather(holder, waiter, return_exceptions=True)
        assert client.in_flight == 0 and store.stats.in_flight == 0
        assert bytes(await client.get("a")) == b"y"

    asyncio.run(main())
    assert store.stats.gets["a"] == 1


# ---------------------------------------------------------------------------- timing


def test_observer_is_told_each_response_size_and_first_byte():
    store = MemoryConfig({"a": b"12345", "b": b"1"}, script=lambda key, attempt: 0.001)
    observer = Recorder()
    _gather(make_client(store), ["a", "b"], observer)
    assert sorted(size for _, size, _ in observer.responses) == [1, 5]
    assert all(first == pytest.approx(0.001) for _, _, first in observer.responses)
    assert all(seconds > 0 for seconds, _, _ in observer.responses)


def test_byte_ranges_reach_the_store():
    client = make_client(MemoryConfig({"a": b"0123456789"}))

    async def main() -> bytes:
        return bytes(await client.get("a", ByteRange(3, 6)))

    assert asyncio.run(main()) == b"345"


def test_repr_names_the_store_and_the_limit():
    client = make_client(MemoryConfig({}), max_inflight_requests=5)
    assert "max_inflight_requests=5" in repr(client)
