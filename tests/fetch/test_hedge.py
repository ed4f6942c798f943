"""Hedged GETs over scripted in-memory stores: when a hedge is sent (only after the delay,
within the budget, never on a throttling store or without a free slot), which bytes win,
that the loser is cancelled, and what the observer is told.

Delays are pinned with ``min_delay == max_delay`` where a test is not about the estimate;
time is read from the event loop, and a test asserts only what the loop guarantees (a
timer never fires early), never how fast something went.
"""

from __future__ import annotations

import asyncio
import gc
import weakref
from collections.abc import AsyncIterator, Sequence

import pytest
from _observers import Recorder

from concurrent_loader import ObjectDataset
from concurrent_loader.config import FetchConfig, HedgeConfig, RetryConfig, Timeouts
from concurrent_loader.errors import (
    AccessDenied,
    ConfigError,
    FetchTimeout,
    Reason,
    ServerError,
    Throttled,
)
from concurrent_loader.fetch import FetchClient
from concurrent_loader.fetch.hedge import (
    BURST,
    MIN_SAMPLES,
    PACE,
    START_TOKENS,
    HedgeBudget,
    HedgeDelay,
)
from concurrent_loader.metrics import StageStats
from concurrent_loader.metrics.stats import COUNTERS
from concurrent_loader.pipeline import BatchPipeline, PipelineOptions
from concurrent_loader.stores.base import Body, ByteRange, Capabilities, ObjectInfo
from concurrent_loader.testing.memory import STALL, MemoryConfig

URL = "memory://test/a"
DELAY = 0.05


def pinned(delay: float = DELAY, **hedge: float) -> HedgeConfig:
    """Hedge after exactly ``delay`` seconds, whatever latencies were seen."""
    return HedgeConfig(min_delay=delay, max_delay=delay, **hedge)


def config_with(hedge: HedgeConfig, **fetch: object) -> FetchConfig:
    retry = RetryConfig(base_delay=0.0, throttle_base_delay=0.0)
    return FetchConfig(retry=retry, hedge=hedge, **fetch)  # type: ignore[arg-type]


class AttemptStore:
    """GET number ``n`` (over all keys, in the order they are sent) answers ``answers[n]``:
    seconds to wait before the bytes ``b"attempt n"``, an exception to raise, ``(seconds,
    exception)`` to raise it after a wait, or STALL.
    Records when each GET was sent and which were cancelled."""

    capabilities = Capabilities(remote=True, listing=False, ranges=True)

    def __init__(self, answers: Sequence[object]) -> None:
        self.answers = list(answers)
        self.sent: list[float] = []
        self.cancelled: list[int] = []
        self.keys: list[str] = []
        self.in_flight = 0

    def url_for(self, key: str) -> str:
        return f"memory://test/{key}"

    async def get(self, key: str, byte_range: ByteRange | None = None) -> Body:
        n = len(self.sent)
        self.sent.append(asyncio.get_running_loop().time())
        self.keys.append(key)
        answer = self.answers[n]
        self.in_flight += 1
        try:
            if isinstance(answer, tuple):
                seconds, answer = answer
                await asyncio.sleep(seconds)
            if isinstance(answer, BaseException):
                raise answer
            if answer is STALL:
                await asyncio.Event().wait()
            assert isinstance(answer, (int, float))
            await asyncio.sleep(answer)
            return Body(f"attempt {n}".encode())
        except asyncio.CancelledError:
            self.cancelled.append(n)
            raise
        finally:
            self.in_flight -= 1

    async def list(self) -> AsyncIterator[ObjectInfo]:  # pragma: no cover - not listed
        return
        yield

    async def close(self) -> None:
        pass


def full_budget(client: FetchClient) -> FetchClient:
    """``client`` with its hedge budget full, so no hedge of a test waits for a token."""
    assert client.hedging is not None
    client.hedging.budget.tokens = BURST
    return client


def run_one(client: FetchClient, observer: Recorder | None = None) -> bytes:
    async def main() -> bytes:
        if observer is None:
            return bytes(await client.get("a"))
        return bytes(await client.get("a", observer=observer))

    return asyncio.run(main())


def throttled() -> Throttled:
    return Throttled("SlowDown", url=URL, cause=Reason.THROTTLED)


# ---------------------------------------------------------------------------- when


def test_a_get_that_answers_within_the_delay_is_not_hedged():
    store = AttemptStore([DELAY / 5])
    client = full_budget(FetchClient(store, config_with(pinned())))
    observer = Recorder()
    assert run_one(client, observer) == b"attempt 0"
    assert len(store.sent) == 1
    assert client.hedging is not None and client.hedging.sent == 0
    assert observer.hedges == 0


class TaskRecording(AttemptStore):
    """Also records the task each GET runs in."""

    def __init__(self, answers: Sequence[object]) -> None:
        super().__init__(answers)
        self.tasks: list[asyncio.Task[object] | None] = []

    async def get(self, key: str, byte_range: ByteRange | None = None) -> Body:
        self.tasks.append(asyncio.current_task())
        return await super().get(key, byte_range)


def test_a_get_runs_in_the_callers_task_and_only_a_hedge_gets_one_of_its_own():
    # No task per GET: the first GET of an attempt runs in the caller's task, late or not.
    store = TaskRecording([DELAY / 5, 10.0, 0.0])
    client = full_budget(FetchClient(store, config_with(pinned())))

    async def main() -> tuple[asyncio.Task[object] | None, list[bytes]]:
        caller = asyncio.current_task()
        return caller, [bytes(await client.get("a")), bytes(await client.get("b"))]

    caller, bodies = asyncio.run(main())
    assert bodies == [b"attempt 0", b"attempt 2"]
    first, late, hedge = store.tasks
    assert first is caller and late is caller
    assert hedge is not None and hedge is not caller
    assert client.hedging is not None and len(client.hedging._watched) <= 1


@pytest.mark.parametrize(
    "answers",
    [
        pytest.param([STALL, 0.0], id="the hedge wins"),
        pytest.param(
            [(1.5 * DELAY, ServerError("503", url=URL, cause=Reason.SERVER_ERROR)), DELAY],
            id="the late GET fails, then the hedge wins",
        ),
        pytest.param([1.5 * DELAY, 10.0], id="the late GET wins"),
    ],
)
def test_no_body_waits_for_the_garbage_collector(answers: list[object]):
    # Bodies are freed when the attempt returns and the caller drops them: a reference
    # cycle (a traceback through a frame that holds the race) would keep them, outside the
    # byte budget, until the cyclic collector ran.
    class Tracked(bytearray):
        pass

    kept: list[weakref.ref[Tracked]] = []

    class Tracking(AttemptStore):
        async def get(self, key: str, byte_range: ByteRange | None = None) -> Body:
            body = Tracked((await super().get(key, byte_range)).data)
            kept.append(weakref.ref(body))
            return Body(body)

    store = Tracking(answers)
    client = full_budget(FetchClient(store, config_with(pinned())))

    async def main() -> int:
        return len(await client.get("a"))

    gc.collect()
    gc.disable()
    try:
        assert asyncio.run(main()) > 0
        assert kept and all(ref() is None for ref in kept)
    finally:
        gc.enable()


def test_gets_that_answer_in_time_are_not_kept_watched():
    store = MemoryConfig({f"{i:03d}": b"x" for i in range(200)})
    hedge = pinned(5.0)
    client = FetchClient(store.open(config_with(hedge)), config_with(hedge))

    async def main() -> None:
        for i in range(200):
            await client.get(f"{i:03d}")

    asyncio.run(main())
    assert client.hedging is not None
    assert len(client.hedging._watched) <= 1  # answered ones leave from the head


def test_a_slow_get_is_hedged_only_after_the_delay_and_the_first_to_finish_wins():
    store = AttemptStore([10.0, 0.0])
    client = full_budget(FetchClient(store, config_with(pinned())))
    observer = Recorder()
    assert run_one(client, observer) == b"attempt 1"  # the hedge's bytes
    primary_sent, hedge_sent = store.sent
    assert hedge_sent - primary_sent >= DELAY - 1e-3  # a loop timer never fires early
    assert store.cancelled == [0]  # the slow primary was cancelled
    assert store.in_flight == 0 and client.in_flight == 0
    assert (observer.hedges, observer.hedges_won) == (1, 1)
    assert len(observer.responses) == 1  # one attempt, one response
    assert client.hedging is not None and (client.hedging.sent, client.hedging.won) == (1, 1)


def test_when_the_primary_finishes_first_the_hedge_is_cancelled():
    store = AttemptStore([1.5 * DELAY, 10.0])
    client = full_budget(FetchClient(store, config_with(pinned())))
    observer = Recorder()
    assert run_one(client, observer) == b"attempt 0"
    assert store.cancelled == [1]
    assert (observer.hedges, observer.hedges_won) == (1, 0)
    assert store.in_flight == 0 and client.in_flight == 0


def test_at_most_two_hedges_per_attempt_and_two_gets_in_flight():
    # The hedge is as late as its GET: a second hedge replaces the primary (cancelled).
    store = AttemptStore([10 * DELAY, 10 * DELAY, 10 * DELAY])
    client = full_budget(FetchClient(store, config_with(pinned())))
    assert run_one(client) in (b"attempt 1", b"attempt 2")
    assert len(store.sent) == 3 and 0 in store.cancelled
    assert store.sent[2] - store.sent[1] == pytest.approx(DELAY, abs=DELAY / 2)


def test_a_second_hedge_rescues_an_object_whose_get_and_hedge_both_stall():
    store = AttemptStore([STALL, STALL, 0.0])
    client = full_budget(FetchClient(store, config_with(pinned())))
    observer = Recorder()
    assert run_one(client, observer) == b"attempt 2"
    assert sorted(store.cancelled) == [0, 1] and store.in_flight == 0
    assert (observer.hedges, observer.hedges_won) == (2, 1) and observer.retries == []


def test_hedging_can_be_turned_off():
    store = AttemptStore([3 * DELAY])
    config = config_with(HedgeConfig(enabled=False, min_delay=DELAY, max_delay=DELAY))
    client = FetchClient(store, config)
    assert client.hedging is None
    assert run_one(client) == b"attempt 0"
    assert len(store.sent) == 1


def test_a_hedge_is_sent_beyond_a_full_limit():
    # The only request slot is held by the slow GET: the hedge takes a hedge slot.
    store = AttemptStore([3 * DELAY, 0.0])
    client = full_budget(FetchClient(store, config_with(pinned(), max_inflight_requests=1)))
    assert run_one(client) == b"attempt 1"
    assert len(store.sent) == 2 and store.cancelled == [0]
    assert client.in_flight == 0


def test_no_hedge_without_a_free_hedge_slot():
    store = AttemptStore([3 * DELAY])
    client = full_budget(FetchClient(store, config_with(pinned(), max_inflight_requests=1)))
    client.limit.hedges_in_flight = client.limit.hedges  # as if other hedges held them all
    assert run_one(client) == b"attempt 0"
    assert len(store.sent) == 1


def test_no_hedge_while_the_store_throttles_most_gets():
    # A round (one GET at a limit of 1) all throttled: the slow retry is not hedged.
    store = AttemptStore([throttled(), 3 * DELAY])
    client = full_budget(FetchClient(store, config_with(pinned(), max_inflight_requests=1)))
    observer = Recorder()
    assert run_one(client, observer) == b"attempt 1"
    assert len(store.sent) == 2 and observer.hedges == 0


# ---------------------------------------------------------------------------- failures


def test_a_transient_failure_of_one_waits_for_the_other():
    class FailingPrimary(AttemptStore):
        async def get(self, key: str, byte_range: ByteRange | None = None) -> Body:
            if not self.sent:  # the primary fails after the hedge was sent
                self.sent.append(asyncio.get_running_loop().time())
                await asyncio.sleep(1.5 * DELAY)
                raise ServerError("boom", url=URL, cause=Reason.SERVER_ERROR)
            return await super().get(key, byte_range)

    store = FailingPrimary([None, 0.8 * DELAY])
    client = full_budget(FetchClient(store, config_with(pinned())))
    observer = Recorder()
    assert run_one(client, observer) == b"attempt 1"
    assert len(store.sent) == 2
    assert observer.retries == []  # the attempt did not fail: its hedge answered
    assert (observer.hedges, observer.hedges_won) == (1, 1)


def test_an_error_a_retry_cannot_mend_ends_the_attempt_at_once():
    denied = AccessDenied("no", url=URL, cause=Reason.ACCESS_DENIED)
    store = AttemptStore([10.0, denied])
    client = full_budget(FetchClient(store, config_with(pinned())))
    with pytest.raises(AccessDenied):
        run_one(client)
    assert store.cancelled == [0]
    assert len(store.sent) == 2 and client.in_flight == 0


def test_a_failed_hedge_of_an_unanswered_get_ends_the_attempt_which_is_retried():
    # The primary stalls; its hedge is throttled: waiting for the stall would cost the
    # read timeout, so the attempt fails with the hedge's error and is retried at once.
    store = AttemptStore([STALL, throttled(), 0.0])
    client = full_budget(FetchClient(store, config_with(pinned())))
    observer = Recorder()
    assert run_one(client, observer) == b"attempt 2"  # the retry
    (error,) = observer.retries
    assert isinstance(error, Throttled)
    assert any("still unanswered, was cancelled" in note for note in error.__notes__)
    assert store.cancelled == [0] and client.in_flight == 0
    assert observer.throttles == 1 and client.limit.throttles == 1


def test_when_both_fail_the_attempt_fails_with_the_hedges_error_and_is_retried():
    class BothFail(AttemptStore):
        async def get(self, key: str, byte_range: ByteRange | None = None) -> Body:
            n = len(self.sent)
            if n == 0:
                self.sent.append(asyncio.get_running_loop().time())
                await asyncio.sleep(1.5 * DELAY)
                raise ServerError("primary", url=URL, cause=Reason.SERVER_ERROR)
            if n == 1:
                self.sent.append(asyncio.get_running_loop().time())
                await asyncio.sleep(0.8 * DELAY)
                raise ServerError("hedge", url=URL, cause=Reason.SERVER_ERROR)
            return await super().get(key, byte_range)

    store = BothFail([None, None, 0.0])
    client = full_budget(FetchClient(store, config_with(pinned())))
    observer = Recorder()
    assert run_one(client, observer) == b"attempt 2"  # the retry
    (error,) = observer.retries
    assert isinstance(error, ServerError) and "hedge" in str(error)
    assert any("the GET it hedged failed too" in note for note in error.__notes__)


def test_the_attempt_deadline_cancels_every_get():
    store = AttemptStore([STALL, STALL, STALL, 0.0])
    config = FetchConfig(
        timeouts=Timeouts(attempt=3.5 * DELAY),
        retry=RetryConfig(base_delay=0.0),
        hedge=pinned(),
    )
    client = full_budget(FetchClient(store, config))
    observer = Recorder()
    assert run_one(client, observer) == b"attempt 3"
    assert sorted(store.cancelled) == [0, 1, 2]
    (error,) = observer.retries
    assert isinstance(error, FetchTimeout) and error.cause is Reason.ATTEMPT_TIMEOUT
    assert store.in_flight == 0 and client.in_flight == 0


def test_cancelling_the_caller_cancels_both_gets_and_frees_their_slots():
    store = AttemptStore([STALL, STALL])
    client = full_budget(FetchClient(store, config_with(pinned())))

    async def main() -> None:
        task = asyncio.create_task(client.get("a"))
        while len(store.sent) < 2:
            await asyncio.sleep(DELAY / 5)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert sorted(store.cancelled) == [0, 1]
        assert client.in_flight == 0

    asyncio.run(main())


def test_a_caller_cancelled_as_its_hedge_wins_is_cancelled_and_leaves_nothing_in_flight():
    # The hedge wins, so the race cancels the GET running in the caller's task, and the
    # caller is cancelled in that same instant: its cancellation is not lost to the race's.
    class CancelledTogether(AttemptStore):
        caller: asyncio.Task[bytes | bytearray]

        async def get(self, key: str, byte_range: ByteRange | None = None) -> Body:
            try:
                return await super().get(key, byte_range)
            except asyncio.CancelledError:
                self.caller.cancel()
                raise

    store = CancelledTogether([STALL, 0.0])
    client = full_budget(FetchClient(store, config_with(pinned())))

    async def main() -> None:
        store.caller = asyncio.create_task(client.get("a"))
        with pytest.raises(asyncio.CancelledError):
            await store.caller
        assert store.cancelled == [0] and len(store.sent) == 2  # the hedge had won
        assert client.in_flight == 0 and store.in_flight == 0

    asyncio.run(main())


# ---------------------------------------------------------------------------- budget


def test_hedges_stay_within_the_budget_over_many_gets():
    # Every GET is slower than the delay, so every one would be hedged without a budget.
    store = MemoryConfig({f"{i:03d}": b"x" for i in range(40)}, latency_s=4 * 0.002)
    hedge = pinned(0.002, budget=0.05)
    client = FetchClient(store.open(config_with(hedge)), config_with(hedge))
    observer = Recorder()
    waves, per_wave = 10, 40

    async def main() -> None:
        for _ in range(waves):
            await asyncio.gather(*(client.get(k, observer=observer) for k in store.objects))

    asyncio.run(main())
    gets = waves * per_wave
    extra = store.stats.total - gets
    assert 0 < extra <= START_TOKENS + hedge.budget * gets
    assert extra == observer.hedges
    assert len(observer.responses) == gets


def test_the_budget_is_a_token_bucket_that_starts_with_its_start_tokens():
    budget = HedgeBudget(0.25)
    assert all(budget.spend() for _ in range(int(START_TOKENS))) and not budget.spend()
    for _ in range(3):
        budget.earn()
    assert not budget.spend()
    budget.earn()
    assert budget.spend()
    for _ in range(1000):
        budget.earn()
    assert budget.tokens == BURST


# ---------------------------------------------------------------------------- delay


def test_the_delay_is_a_high_percentile_of_recent_latencies_within_its_bounds():
    delay = HedgeDelay(HedgeConfig(percentile=95, min_delay=0.01, max_delay=1.0))
    for ms in range(1, MIN_SAMPLES):
        delay.observe(ms / 1000)
    assert delay.seconds == 1.0  # too few latencies yet: the ceiling
    delay = HedgeDelay(HedgeConfig(percentile=95, min_delay=0.01, max_delay=1.0))
    for ms in range(1, 101):
        delay.observe(ms / 1000)
    assert delay.seconds == pytest.approx(0.095, abs=0.016)  # recomputed every few
    floor = HedgeDelay(HedgeConfig(min_delay=0.05, max_delay=1.0))
    for _ in range(100):
        floor.observe(0.001)
    assert floor.seconds == 0.05
    ceiling = HedgeDelay(HedgeConfig(min_delay=0.05, max_delay=1.0))
    for _ in range(100):
        ceiling.observe(30.0)
    assert ceiling.seconds == 1.0


def test_the_delay_follows_the_store_when_it_slows_down():
    delay = HedgeDelay(HedgeConfig(min_delay=0.001, max_delay=10.0))
    for _ in range(300):
        delay.observe(0.01)
    assert delay.seconds == pytest.approx(0.01)
    for _ in range(300):
        delay.observe(0.5)
    assert delay.seconds == pytest.approx(0.5)  # the old latencies left the window


@pytest.mark.parametrize(
    "make",
    [
        lambda: HedgeConfig(percentile=0),
        lambda: HedgeConfig(percentile=100),
        lambda: HedgeConfig(min_delay=0),
        lambda: HedgeConfig(max_delay=float("inf")),
        lambda: HedgeConfig(min_delay=0.5, max_delay=0.1),
        lambda: HedgeConfig(budget=0),
        lambda: HedgeConfig(budget=1.5),
        lambda: HedgeConfig(enabled="yes"),  # type: ignore[arg-type]
    ],
)
def test_invalid_hedge_settings_fail_at_construction(make):
    with pytest.raises(ConfigError):
        make()


def test_hedging_is_on_by_default():
    hedge = FetchConfig().hedge
    assert hedge.enabled and hedge.percentile == 98 and hedge.budget == 0.05
    assert 0 < hedge.min_delay < hedge.max_delay


# ---------------------------------------------------------------------------- pipeline


def test_a_pipeline_gets_every_sample_once_in_order_and_counts_its_hedges(helpers):
    count = 40
    slow = {helpers.key_for(i) for i in (3, 17, 31)}

    def script(key: str, attempt: int) -> object:
        return 10.0 if key in slow and attempt == 0 else 0.001

    store = MemoryConfig(helpers.numbered_objects(count), script=script)
    # Every slow GET is hedged (budget 1); fast ones answer long before the delay.
    config = config_with(pinned(0.2, budget=1.0))
    dataset = ObjectDataset(store, decode=helpers.index_of, fetch_config=config)
    batches = [list(range(i, i + 8)) for i in range(0, count, 8)]
    pipeline = BatchPipeline(
        dataset, batches, collate_fn=list, options=PipelineOptions(prefetch_batches=5)
    )
    assert list(pipeline) == batches
    counters = dict(zip(COUNTERS, pipeline.stats.vector(), strict=False))
    assert counters["hedges"] == counters["hedges_won"] == len(slow)
    assert counters["objects"] == count
    assert all(store.stats.gets[key] == 2 for key in slow)


def test_stage_stats_count_hedges_sent_and_won():
    store = AttemptStore([10.0, 0.0])
    client = full_budget(FetchClient(store, config_with(pinned())))
    stats = StageStats()

    async def main() -> None:
        await client.get("a", observer=stats)

    asyncio.run(main())
    counters = dict(zip(COUNTERS, stats.vector(), strict=False))
    assert (counters["hedges"], counters["hedges_won"], counters["objects"]) == (1, 1, 1)


# ------------------------------------------------------------------ when the hedge goes


def run_together(client: FetchClient, keys: Sequence[str]) -> list[bytes]:
    """GETs of ``keys`` sent in that order, in the same instant."""

    async def main() -> list[bytes]:
        return [bytes(body) for body in await asyncio.gather(*map(client.get, keys))]

    return asyncio.run(main())


def test_gets_due_together_are_hedged_a_turn_apart_oldest_first():
    store = AttemptStore([STALL, STALL, STALL, 0.0, 0.0, 0.0])
    client = full_budget(FetchClient(store, config_with(pinned())))
    assert run_together(client, ["a", "b", "c"]) == [b"attempt 3", b"attempt 4", b"attempt 5"]
    assert store.keys == ["a", "b", "c", "a", "b", "c"]
    turn = DELAY / PACE
    assert store.sent[3] - store.sent[0] >= DELAY - 0.001
    assert store.sent[4] - store.sent[3] >= turn - 0.001  # a timer never fires early
    assert store.sent[5] - store.sent[4] >= turn - 0.001


def test_a_get_that_answers_before_its_turn_is_not_hedged_and_the_turn_passes_on():
    # Three GETs come due together (a burst): "a" is hedged at once, "b" answers before
    # its turn (it only queued), and the turn goes to "c", still unanswered (a stall).
    delay = 0.2
    store = AttemptStore([STALL, (1 + 0.5 / PACE) * delay, STALL, 0.0, 0.0])
    client = full_budget(FetchClient(store, config_with(pinned(delay))))
    assert run_together(client, ["a", "b", "c"]) == [b"attempt 3", b"attempt 1", b"attempt 4"]
    assert store.keys == ["a", "b", "c", "a", "c"]
    assert store.sent[4] - store.sent[3] >= delay / PACE - 0.001
    assert client.hedging is not None
    assert client.hedging.sent == 2


def test_a_waiting_get_follows_the_estimate_as_it_falls():
    # Sent before any latency was known (delay = max_delay = 5 s); the estimate then
    # falls to 20 ms and the waiting GET is hedged at once, not 5 s after its send.
    store = AttemptStore([STALL, 0.0])
    hedge = HedgeConfig(min_delay=0.02, max_delay=5.0)
    client = full_budget(FetchClient(store, config_with(hedge)))
    assert client.hedging is not None

    async def main() -> bytes:
        task = asyncio.create_task(client.get("a"))
        await asyncio.sleep(DELAY)
        for _ in range(MIN_SAMPLES):
            client.hedging.delay.observe(0.001)
        return bytes(await asyncio.wait_for(task, 1.0))

    assert asyncio.run(main()) == b"attempt 1"
    assert store.sent[1] - store.sent[0] < 4 * DELAY


# ------------------------------------------------------------------ tasks and teardown


def test_a_late_get_without_a_token_gets_no_task():
    # Late, but the budget is empty: no hedge, so no task besides the caller's.
    store = TaskRecording([3 * DELAY])
    client = FetchClient(store, config_with(pinned()))
    assert client.hedging is not None
    client.hedging.budget.tokens = 0.0

    async def main() -> int:
        task = asyncio.create_task(client.get("a"))
        await asyncio.sleep(2 * DELAY)  # late by now
        tasks = len(asyncio.all_tasks())
        await task
        return tasks

    assert asyncio.run(main()) == 2  # main and the caller
    assert store.tasks and len(store.sent) == 1


@pytest.mark.parametrize("how", ["cancelled", "deadline"])
def test_a_caller_waiting_for_its_hedge_after_its_get_failed_leaves_nothing_in_flight(how):
    # The first GET fails (transiently) after its hedge was sent: the caller waits for the
    # hedge; cancelling it, or its attempt's deadline, cancels the hedge and frees its slot.
    failure = ServerError("503", url=URL, cause=Reason.SERVER_ERROR)
    store = AttemptStore([(1.5 * DELAY, failure), STALL, 0.0])
    timeouts = Timeouts(attempt=3 * DELAY if how == "deadline" else 60.0)
    client = FetchClient(store, config_with(pinned(), timeouts=timeouts))
    assert client.hedging is not None
    client.hedging.budget.tokens = 1.0  # one hedge: none replaces the first

    async def main() -> None:
        task = asyncio.create_task(client.get("a"))
        await asyncio.sleep(2 * DELAY)  # the first GET failed, the hedge is in flight
        assert len(store.sent) == 2 and store.in_flight == 1
        if how == "cancelled":
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
        else:
            assert bytes(await task) == b"attempt 2"  # the retry, after the deadline
        assert 1 in store.cancelled
        assert client.in_flight == 0 and store.in_flight == 0
        assert client.limit.hedges_in_flight == 0

    asyncio.run(main())


# -- checksums over the real transport: one digest per GET ---------------------------------

CHECKED_BODY = bytes(range(256)) * 1200  # 300 KB


class TrickledObject:
    """An S3-like server on the test's loop: GET number ``n`` waits ``head_delays[n]``
    seconds (0 past the list), then sends the object with its ``x-amz-checksum-crc32`` in 8
    pieces 15 ms apart; the GETs numbered in ``corrupt`` get one byte inverted."""

    def __init__(self, head_delays: Sequence[float] = (), corrupt: Sequence[int] = ()) -> None:
        self.head_delays = head_delays
        self.corrupt = corrupt
        self.requests = 0
        self.handlers: set[asyncio.Task[None]] = set()

    async def __aenter__(self) -> str:
        self.server = await asyncio.start_server(self.handle, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def __aexit__(self, *exc_info: object) -> None:
        self.server.close()
        for task in self.handlers:
            task.cancel()
        await asyncio.gather(*self.handlers, return_exceptions=True)
        await self.server.wait_closed()

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        import base64
        import zlib

        task = asyncio.current_task()
        assert task is not None
        self.handlers.add(task)
        crc = base64.b64encode(zlib.crc32(CHECKED_BODY).to_bytes(4, "big")).decode()
        try:
            while await reader.readuntil(b"\r\n\r\n"):
                n = self.requests
                self.requests += 1
                await asyncio.sleep(self.head_delays[n] if n < len(self.head_delays) else 0)
                body = bytearray(CHECKED_BODY)
                if n in self.corrupt:
                    body[len(body) // 2] ^= 0xFF
                writer.write(
                    b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nx-amz-checksum-crc32: %s\r\n\r\n"
                    % (len(body), crc.encode())
                )
                step = len(body) // 8 + 1
                for i in range(0, len(body), step):
                    writer.write(body[i : i + step])
                    await writer.drain()
                    await asyncio.sleep(0.015)
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            pass
        finally:
            self.handlers.discard(task)
            writer.close()


def checked_client(endpoint: str, fetch: FetchConfig) -> FetchClient:
    from concurrent_loader.stores.s3 import S3Config

    config = S3Config.from_url(
        "s3://bkt/", endpoint_url=endpoint, region="us-east-1", anonymous=True,
        addressing_style="path",
    ).resolved()  # fmt: skip
    return FetchClient(config.open(fetch), fetch)


def running_checksums(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """Every running checksum a store makes from now on, in order."""
    from concurrent_loader.stores.checksum import Checksum

    made: list[object] = []
    running = Checksum.running

    def recorded(self: Checksum) -> object:
        made.append(running(self))
        return made[-1]

    monkeypatch.setattr(Checksum, "running", recorded)
    return made


def test_a_hedge_and_its_get_never_share_a_digest(monkeypatch: pytest.MonkeyPatch) -> None:
    made = running_checksums(monkeypatch)
    # The GET's head comes after the hedge was sent, so both bodies stream at once: one
    # digest fed both would see their pieces interleaved and fail the check.
    fetch = FetchConfig(retry=RetryConfig(max_attempts=1), hedge=pinned(0.03))

    async def main() -> tuple[bytes, int]:
        server = TrickledObject(head_delays=[0.06])
        async with server as endpoint:
            client = checked_client(endpoint, fetch)
            try:
                data = await client.get("a.bin")
            finally:
                await client.close()
            return bytes(data), server.requests

    data, requests = asyncio.run(main())
    assert data == CHECKED_BODY
    assert requests >= 2  # the GET and its hedge(s)
    assert 2 <= len(made) <= requests and len({id(m) for m in made}) == len(made)


def test_a_retry_after_a_mismatch_gets_a_fresh_digest(monkeypatch: pytest.MonkeyPatch) -> None:
    made = running_checksums(monkeypatch)
    retry = RetryConfig(max_attempts=3, base_delay=0.0)
    fetch = FetchConfig(retry=retry, hedge=HedgeConfig(enabled=False))

    async def main() -> tuple[bytes, int]:
        server = TrickledObject(corrupt=[0])
        async with server as endpoint:
            client = checked_client(endpoint, fetch)
            try:
                data = await client.get("a.bin")
            finally:
                await client.close()
            return bytes(data), server.requests

    data, requests = asyncio.run(main())
    assert data == CHECKED_BODY
    assert requests == 2
    assert len(made) == 2 and made[0] is not made[1]
    assert [m.length for m in made] == [len(CHECKED_BODY)] * 2  # type: ignore[attr-defined]
