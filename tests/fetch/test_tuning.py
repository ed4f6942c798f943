"""LimitController with scripted GETs: once-per-round cuts, the floor, recovery without a
fixed cool-down, slow start, and the latency gradient of the self-tuned limit."""

from __future__ import annotations

import math

import pytest

from concurrent_loader.fetch.tuning import FLOOR, WINDOW_SAMPLES, LimitController


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def run_round(
    c: LimitController,
    *,
    throttled: int = 0,
    latency: float = 0.03,
    bound: bool = True,
    gets: int | None = None,
) -> int:
    """One round: ``gets`` (default: the limit) GETs sent and ended, the first ``throttled``
    of them throttled, the others in ``latency`` s; returns the limit after it."""
    n = c.limit if gets is None else gets
    marks = [c.on_send() for _ in range(n)]
    if bound:
        c.limit_reached()
    for i, mark in enumerate(marks):
        if i < throttled:
            c.on_done(mark, latency=None, throttled=True)
        else:
            c.on_done(mark, latency=latency)
    return c.limit


def test_maximum_must_be_positive():
    with pytest.raises(ValueError):
        LimitController(0, self_tuned=True)


def test_a_burst_of_throttles_of_gets_already_in_flight_cuts_once():
    c = LimitController(64, self_tuned=False)
    marks = [c.on_send() for _ in range(200)]  # more than a round in flight
    for mark in marks:
        c.on_done(mark, latency=None, throttled=True)
    # The first 64 end a round (all throttled: halved); the other 136 were sent before
    # that cut and could not have seen it.
    assert c.limit == 32
    assert c.throttles == 200 and c.rounds == 1


def test_the_cut_is_half_the_throttled_fraction():
    c = LimitController(64, self_tuned=False)
    # 1/8 throttled, not limit-bound (so no growth): 64 * (1 - 1/16)
    assert run_round(c, throttled=8, bound=False) == 60
    assert c.last_throttled_fraction == pytest.approx(0.125)


def test_a_steady_ten_percent_of_throttles_keeps_a_busy_limit_high():
    c = LimitController(64, self_tuned=False)
    for _ in range(50):
        run_round(c, throttled=max(1, c.limit // 10))
    # cuts of 5 % per round are outgrown by sqrt(limit) per busy round
    assert c.limit >= 48


def test_a_storm_cuts_to_the_floor_and_it_grows_back_without_a_cooldown():
    c = LimitController(64, self_tuned=False)
    for _ in range(10):
        run_round(c, throttled=10**6)
    assert c.limit == FLOOR and c.last_throttled_fraction == 1.0
    rounds = 0
    while c.limit < 64:
        run_round(c)
        rounds += 1
    assert rounds <= 15  # +sqrt(limit) a round: 4 -> 64 in about a dozen round trips


def test_a_pinned_limit_never_exceeds_its_value_and_an_idle_one_does_not_grow():
    c = LimitController(16, self_tuned=False)
    run_round(c, throttled=16)
    assert c.limit == 8
    for _ in range(5):
        run_round(c, bound=False)  # nobody waited for a slot: nothing proves more helps
    assert c.limit == 8
    for _ in range(10):
        run_round(c)
    assert c.limit == 16


def test_a_limit_below_the_floor_stays_within_its_maximum():
    c = LimitController(2, self_tuned=False)
    run_round(c, throttled=2)
    assert c.limit == 2 == c.minimum


def test_the_cooldown_delays_growth_after_a_throttle():
    clock = Clock()
    c = LimitController(16, self_tuned=False, cooldown=5.0, clock=clock)
    run_round(c, throttled=16)
    for _ in range(5):
        run_round(c)
    assert c.limit == 8
    clock.now = 5.0
    run_round(c)
    assert c.limit > 8


def test_self_tuned_starts_at_the_cap_and_holds_while_latency_holds():
    c = LimitController(64, self_tuned=True)
    assert c.limit == 64
    assert [run_round(c) for _ in range(4)] == [64, 64, 64, 64]


def test_self_tuned_backs_off_when_latency_queues_and_settles():
    """A scripted store: 20 ms at any load at first; then its capacity drops, and beyond 16
    in flight GETs queue (latency grows as in_flight / 16 x 20 ms: a throughput ceiling,
    Little's law)."""
    clock = Clock()
    c = LimitController(64, self_tuned=True, clock=clock)
    for _ in range(5):
        clock.now += 0.02
        run_round(c, latency=0.020)
    assert c.limit == 64 and c.baseline_s == pytest.approx(0.020)

    def latency(in_flight: int) -> float:
        return 0.020 * max(1.0, in_flight / 16)

    limits = []
    for _ in range(400):  # about 18 s of rounds, within the baseline's 30 s
        clock.now += latency(c.limit)
        limits.append(run_round(c, latency=latency(c.limit)))
    settled = limits[-10:]
    # Queueing is refused once latency passes 2 x 20 ms + 5 ms: 36 in flight; the limit
    # probes one step (+sqrt) above that at most, never back to the cap.
    assert all(16 <= value <= 44 for value in settled), limits
    assert c.baseline_s == pytest.approx(0.020)


def test_the_baseline_follows_a_store_that_got_slower():
    clock = Clock()
    c = LimitController(64, self_tuned=True, clock=clock)
    for _ in range(3):
        run_round(c, latency=0.010)
    assert c.baseline_s == pytest.approx(0.010)
    for _ in range(100):  # the store is now 5 x slower for everyone, at any load
        clock.now += 1.0
        run_round(c, latency=0.050)
    assert c.baseline_s == pytest.approx(0.050)
    assert c.limit == 64  # no longer mistaken for queueing


def test_self_tuned_latency_cut_needs_a_full_window():
    c = LimitController(8, self_tuned=True)
    run_round(c, gets=WINDOW_SAMPLES - 1, latency=0.02)
    assert c.baseline_s is None
    run_round(c, gets=WINDOW_SAMPLES, latency=0.02)
    assert c.baseline_s == pytest.approx(0.02)


def test_failures_without_latency_neither_cut_nor_sample():
    c = LimitController(8, self_tuned=True)
    marks = [c.on_send() for _ in range(8)]
    for mark in marks:
        c.on_done(mark, latency=None)
    assert c.limit == 8 and c.throttles == 0 and c.baseline_s is None


def test_a_start_outside_one_to_maximum_is_refused():
    with pytest.raises(ValueError):
        LimitController(64, self_tuned=True, start=65)
    with pytest.raises(ValueError):
        LimitController(64, self_tuned=True, start=0)


def test_a_pinned_limit_ignores_the_start_and_never_doubles():
    c = LimitController(16, self_tuned=False, start=4)
    assert c.limit == 16
    run_round(c, throttled=16)
    assert [run_round(c) for _ in range(2)] == [10, 14]  # 8 + sqrt(8), then + sqrt: never x 2


def _store_of_capacity(capacity: float, latency: float, *, queues: bool):
    """A round of ``limit`` GETs against a store serving at most ``capacity`` GETs/s: it
    lasts ``max(latency, limit / capacity)``; with ``queues`` its GETs wait that long too
    (Little's law), else their latency holds (the ceiling is elsewhere, as a busy client)."""
    clock = Clock()

    def round_of(c: LimitController) -> int:
        seconds = max(latency, c.limit / capacity)
        clock.now += seconds
        return run_round(c, latency=seconds if queues else latency)

    return clock, round_of


def test_self_tuned_doubles_past_its_start_then_settles_within_the_queueing_tolerance():
    """At 200 ms a store of 2,000 GETs/s needs 400 in flight: the limit doubles from 64 in
    three rounds (not the thirty that growth by square roots takes), leaves slow start as
    latency rises, and settles where latency stays within 2 x baseline + 5 ms."""
    clock, round_of = _store_of_capacity(2000, 0.2, queues=True)
    c = LimitController(1024, self_tuned=True, start=64, clock=clock)
    limits = [round_of(c) for _ in range(60)]
    assert limits[:3] == [128, 256, 512]
    assert all(400 <= value <= 850 for value in limits[3:]), limits
    assert c.baseline_s == pytest.approx(0.2)


def test_a_doubling_that_does_not_raise_the_rate_is_undone():
    """Latency holds but the rate stops at 1,000 GETs/s from 200 in flight: the doubling to
    512 brings nothing, so the limit goes back to 256 and grows by square roots from there."""
    clock, round_of = _store_of_capacity(1000, 0.2, queues=False)
    c = LimitController(1024, self_tuned=True, start=64, clock=clock)
    limits = [round_of(c) for _ in range(4)]
    assert limits == [128, 256, 512, 256 + 16]


def test_a_store_that_jumps_from_20_to_200_ms_is_a_new_baseline_within_a_few_rounds():
    """Latency that three cuts in a row do not bring down is not queueing of ours: the limit
    takes the new latency as its baseline and slow start doubles it back, instead of sitting
    near the floor until the old baseline is 30 s old."""
    clock = Clock()
    c = LimitController(1024, self_tuned=True, start=64, clock=clock)
    latency = 0.02
    limits = []
    for i in range(40):
        if i == 20:
            latency = 0.2
        clock.now += latency
        limits.append(run_round(c, latency=latency))
    before, after = limits[:20], limits[20:]
    assert before[-1] == 1024  # nothing queues, every doubling paid
    assert after[:3] == [512, 256, 128]  # three cuts...
    assert min(after) >= 128 and after[-1] == 1024  # ...then back, within 20 rounds of 200 ms
    assert c.baseline_s == pytest.approx(0.2)
    assert clock.now - 20 * 0.02 < 5.0  # seconds, not the baseline's 30


def test_queueing_that_cuts_relieve_never_resets_the_baseline():
    clock, round_of = _store_of_capacity(5000, 0.02, queues=True)  # 100 in flight at 20 ms
    c = LimitController(1024, self_tuned=True, start=64, clock=clock)
    for _ in range(300):
        round_of(c)
        assert c.baseline_s == pytest.approx(0.02)


def _simulate(servers: int, service, seconds: float, *, seed: int = 0):
    """GETs kept at the limit against a store of ``servers`` FIFO servers (0: unlimited),
    each GET taking ``service(now)`` +-20 % of service: a discrete-event run of the real
    controller. Returns ``(time, limit, baseline)`` after each round."""
    import heapq
    import random

    rng = random.Random(seed)
    clock = Clock()
    c = LimitController(1024, self_tuned=True, start=64, clock=clock)
    free = [0.0] * servers
    events: list[tuple[float, int, float]] = []
    history: list[tuple[float, int, float | None]] = []

    def send(now: float) -> None:
        mark = c.on_send()
        start = max(now, heapq.heappop(free)) if servers else now
        end = start + service(now) * rng.uniform(0.8, 1.2)
        if servers:
            heapq.heappush(free, end)
        heapq.heappush(events, (end, mark, end - now))

    while len(events) < c.limit:
        send(0.0)
    c.limit_reached()
    while events and clock.now < seconds:
        clock.now, mark, latency = heapq.heappop(events)
        rounds = c.rounds
        c.on_done(mark, latency=latency)
        if c.rounds != rounds:
            history.append((clock.now, c.limit, c.baseline_s))
        while len(events) < c.limit:
            send(clock.now)
        c.limit_reached()
    return history


def test_queueing_of_our_own_never_becomes_the_baseline():
    """200 servers of 50 ms: beyond 200 in flight GETs queue. Small proportional cuts in a
    row that leave latency high must not be read as a slower store (each such misreading
    re-based the latency upwards and doubled the limit again: 1,024 in flight at 4x the
    real latency)."""
    history = _simulate(200, lambda now: 0.05, 15.0)
    assert all(baseline <= 0.05 * 1.25 for _, _, baseline in history if baseline), history
    assert all(limit <= 600 for _, limit, _ in history[10:]), history


def test_slow_start_doubles_from_64_to_the_cap_against_a_distant_store():
    """200 ms at any load: the first round is one burst and the next ones are longer, so a
    rate compared with the first would undo the first doubling."""
    history = _simulate(0, lambda now: 0.2, 3.0)
    assert [limit for _, limit, _ in history[:4]] == [128, 256, 512, 1024]
    assert history[3][0] < 2.0


def test_a_jump_from_20_to_200_ms_is_a_new_baseline_within_seconds():
    history = _simulate(0, lambda now: 0.02 if now < 10 else 0.2, 16.0)
    rebased = next(t for t, _, baseline in history if baseline and baseline > 0.1)
    assert rebased < 10 + 3.0
    assert next(t for t, limit, _ in history if t > rebased and limit == 1024) < 10 + 5.0


def _paced_pipeline(
    decode_rate: float, latency: float, seconds: float, *, start: int = 64, batch: int = 32
) -> tuple[list[int], float]:
    """A pipeline as the loader's with batches following the limit: a batch's ``batch`` GETs
    start at once while fewer samples than the limit are in progress, GETs beyond the limit
    wait for a slot, each GET takes ``latency`` +-20 %, and one decoder takes fetched samples
    at ``decode_rate`` per second. One epoch of a fresh controller from ``start``: the limit
    after each round and the samples decoded per second."""
    import heapq
    import random

    rng = random.Random(start)
    clock = Clock()
    c = LimitController(1024, self_tuned=True, start=start, clock=clock)
    gets: list[tuple[float, int, float]] = []  # (end, mark, sent)
    waiting = fetched = in_progress = decoded = 0
    decoding_until = math.inf  # when the sample being decoded is done
    limits: list[int] = []

    def send() -> None:
        end = clock.now + latency * rng.uniform(0.8, 1.2)
        heapq.heappush(gets, (end, c.on_send(), clock.now))

    while clock.now < seconds:
        while in_progress < c.limit:  # top up, a batch at a time
            in_progress += batch
            for _ in range(batch):
                if len(gets) < c.limit:
                    send()
                else:
                    waiting += 1
            if waiting or len(gets) >= c.limit:
                c.limit_reached()
        if fetched and decoding_until == math.inf:
            decoding_until = clock.now + 1 / decode_rate
        if gets and gets[0][0] <= decoding_until:
            clock.now, mark, sent = heapq.heappop(gets)
            fetched += 1
            rounds = c.rounds
            c.on_done(mark, latency=clock.now - sent)
            if c.rounds != rounds:
                limits.append(c.limit)
            while waiting and len(gets) < c.limit:
                waiting -= 1
                send()
        else:
            clock.now, decoding_until = decoding_until, math.inf
            fetched -= 1
            in_progress -= 1
            decoded += 1
    return limits, decoded / clock.now


def test_a_pipeline_paced_by_decoding_does_not_grow_the_limit_it_does_not_use():
    """At +200 ms a decoder of 250 samples/s needs 50 GETs in flight (Little's law). Batches
    that follow the limit start 32 GETs at once, so some wait for a slot in every round;
    that asks for no more while the limit is not in use. Nor does a limit carried into the
    next epoch double again at each epoch's first round (it reached 1,024 per process in
    the loader by the third epoch, where the pipeline's extra work cost 18 % of its rate)."""
    start = 64
    for _ in range(5):
        limits, rate = _paced_pipeline(decode_rate=250, latency=0.2, seconds=4, start=start)
        assert max(limits[3:]) <= 4 * 50, limits
        assert rate >= 0.9 * 250
        start = limits[-1]
    assert start <= 4 * 50


def test_a_limit_above_what_a_paced_pipeline_uses_shrinks_to_twice_its_use():
    """A limit carried high into an epoch paced by decoding (600 where 50 are in use) comes
    down to about twice what is in use (after the round of 1,024 its first round doubled it
    to), and no lower than the start of 64."""
    limits, rate = _paced_pipeline(decode_rate=250, latency=0.2, seconds=10, start=600)
    assert 64 <= limits[-1] <= 4 * 50, limits
    assert rate >= 0.9 * 250
    limits, _ = _paced_pipeline(decode_rate=100, latency=0.2, seconds=20, start=600)
    assert limits[-1] == 64, limits  # 20 in use: the floor


def test_a_pipeline_paced_by_fetching_grows_the_limit_to_its_rate():
    """The same pipeline with a decoder of 5,000 samples/s: 1,000 GETs in flight to keep it
    busy at 200 ms, and the limit doubles to its maximum within seconds."""
    limits, rate = _paced_pipeline(decode_rate=5000, latency=0.2, seconds=10)
    assert limits[:4] == [128, 256, 512, 1024]
    assert rate >= 0.8 * 5000 * (10 - 2) / 10


def test_a_pause_with_nothing_in_flight_does_not_read_as_an_unused_limit():
    """Half a round, then 10 s with nothing in flight (a validation pass, a checkpoint: the
    pipeline is full), then the other half: 512 GETs in flight whenever any were, so the
    limit is in use and stays (counting the pause took it to the floor of 64)."""
    clock = Clock()
    c = LimitController(1024, self_tuned=True, start=512, clock=clock)
    for pause in (10.0, 0.0):
        marks = [c.on_send() for _ in range(256)]
        clock.now += 0.2
        for mark in marks:
            c.on_done(mark, latency=0.2)
        clock.now += pause
    assert c.rounds == 1 and c.limit >= 512


def test_a_limit_that_starts_at_its_maximum_still_shrinks_to_what_is_used():
    limits, _ = _paced_pipeline(decode_rate=250, latency=0.2, seconds=20, start=1024)
    assert limits[-1] <= 4 * 50, limits


def test_a_storm_of_throttles_is_cut_by_half_not_shrunk_as_unused():
    clock = Clock()
    c = LimitController(1024, self_tuned=True, start=1024, clock=clock)
    marks = [c.on_send() for _ in range(1024)]
    clock.now += 0.1
    for mark in marks:
        c.on_done(mark, latency=None, throttled=True)
    assert c.limit == 512
