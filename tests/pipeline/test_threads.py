"""The decode-thread hill climb (``pipeline/threads.py``) on a simulated pipeline: a fetch
stage delivering samples at a scripted rate (smoothly or in bursts, as a batch's GETs land
together, with pauses), decode jobs sharing a scripted number of cores (processor sharing,
with CPU taken by other work), a bounded pipeline, as the process runs it (``DecodeQueue``:
a job takes the earliest sample and reports whether another waited)."""

from __future__ import annotations

import itertools
import random
from collections import Counter
from collections.abc import Callable

import pytest

from concurrent_loader.pipeline.threads import HOLD_S, ThreadController

DT = 0.001


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def simulate(
    *,
    seconds: float,
    start: int,
    maximum: int,
    cores: Callable[[float], float],
    fetch_per_s: Callable[[float], float],
    decode_cpu_s: float = 0.004,
    depth: int = 256,
    burst: int = 1,
    seed: int = 0,
) -> tuple[list[int], list[int]]:
    """Threads in force and samples decoded, per 100 ms of simulated time."""
    clock = Clock()
    tuner = ThreadController(start, maximum, clock=clock)
    rng = random.Random(seed)
    waiting = 0  # fetched, not taken by a job
    jobs: list[list[float]] = []  # [cpu work left, began at]
    fetch_credit = 0.0
    spare: list[float] = []
    threads_trace: list[int] = []
    decoded_trace: list[int] = []
    decoded = 0
    step = 0
    while clock.now < seconds:
        t = clock.now
        # Fetch: samples land at the scripted rate while the pipeline has room.
        # Fetch: samples land at the scripted rate, ``burst`` at a time, while the pipeline
        # has room (a rate of 0: a pause, or workers starting).
        fetch_credit += fetch_per_s(t) * DT
        while fetch_credit >= burst and waiting + len(jobs) + burst <= depth:
            fetch_credit -= burst
            waiting += burst
        fetch_credit = min(fetch_credit, float(burst))
        # Jobs take samples while fewer than the controller's threads run; a job that ended
        # within the last step hands the rest of that step's CPU to the next.
        while waiting and len(jobs) < tuner.threads:
            waiting -= 1
            carry = spare.pop() if spare else 0.0
            jobs.append([decode_cpu_s * rng.uniform(0.8, 1.2) - carry, t, waiting > 0])
        spare.clear()
        # Processor sharing: each running job gets an equal share of the free cores.
        if jobs:
            share = min(1.0, max(cores(t), 0.05) / len(jobs))
            for job in jobs:
                job[0] -= share * DT
        clock.now = t + DT
        done = [job for job in jobs if job[0] <= 0]
        for job in done:
            jobs.remove(job)
            spare.append(-job[0])
            decoded += 1
            tuner.observe(clock.now - job[1], bool(job[2]))
        step += 1
        if step % 100 == 0:
            threads_trace.append(tuner.threads)
            decoded_trace.append(decoded)
            decoded = 0
    return threads_trace, decoded_trace


def rate(decoded: list[int], start_s: float, end_s: float) -> float:
    window = decoded[int(start_s * 10) : int(end_s * 10)]
    return sum(window) / (len(window) / 10)


def settled(threads: list[int], start_s: float) -> tuple[int, float]:
    """The most common count after ``start_s``, and the share of the time it was in force."""
    tail = threads[int(start_s * 10) :]
    value, count = Counter(tail).most_common(1)[0]
    return value, count / len(tail)


def test_decode_bound_on_four_cores_it_climbs_to_the_cores_and_settles():
    threads, decoded = simulate(
        seconds=60, start=1, maximum=8, cores=lambda t: 4.0, fetch_per_s=lambda t: 5000
    )
    value, share = settled(threads, 20)
    assert value == 4 and share >= 0.8, (value, share)
    assert max(threads[200:]) <= 5  # probes past the cores are undone
    # 4 cores / 4 ms per image = 1,000 images/s at best.
    assert rate(decoded, 20, 60) >= 0.95 * 1000


def test_a_budget_of_one_core_keeps_one_thread():
    threads, decoded = simulate(
        seconds=40, start=1, maximum=1, cores=lambda t: 1.0, fetch_per_s=lambda t: 5000
    )
    assert set(threads) == {1}
    assert rate(decoded, 5, 40) >= 0.95 * 250


def test_on_one_free_core_a_larger_share_finds_no_gain_and_stays_at_one():
    threads, decoded = simulate(
        seconds=60, start=1, maximum=4, cores=lambda t: 1.0, fetch_per_s=lambda t: 5000
    )
    value, share = settled(threads, 5)
    assert value == 1 and share >= 0.8, (value, share)
    assert max(threads) <= 2
    assert rate(decoded, 5, 60) >= 0.95 * 250


def test_fetch_bound_it_gives_back_the_threads_it_does_not_need():
    # 300 samples/s arrive; each thread decodes 250/s: two threads keep up.
    threads, decoded = simulate(
        seconds=30, start=8, maximum=8, cores=lambda t: 8.0, fetch_per_s=lambda t: 300
    )
    value, share = settled(threads, 15)
    assert value == 2 and share >= 0.8, (value, share)
    assert rate(decoded, 15, 30) >= 0.97 * 300


def test_a_change_of_regime_is_followed_both_ways():
    # Fetching is the bottleneck while latency is high (200 samples/s arrive), then the
    # store speeds up (latency 200 -> 20 ms: 2,000/s): decoding becomes the bottleneck.
    # Then another job takes three of the four cores.
    def fetch(t: float) -> float:
        return 200 if t < 30 else 2000

    def cores(t: float) -> float:
        return 4.0 if t < 70 else 1.0

    threads, decoded = simulate(seconds=110, start=4, maximum=4, cores=cores, fetch_per_s=fetch)
    assert settled(threads, 10)[0] == 1 or max(threads[100:300]) <= 2  # fetch-bound: few
    assert settled(threads, 30 + 2 * HOLD_S)[0] == 4
    assert rate(decoded, 50, 70) >= 0.95 * 1000
    # On one core, more threads than one pay nothing; the rate is the core's.
    assert rate(decoded, 75, 110) >= 0.95 * 250


def test_when_latency_jumps_from_20_to_200_ms_the_threads_are_given_back():
    # Decoding is the bottleneck while GETs take 20 ms (2,000 samples/s could arrive); at
    # 200 ms only 200/s arrive, which one thread decodes at 80 % busy.
    def fetch(t: float) -> float:
        return 2000 if t < 30 else 200

    threads, decoded = simulate(
        seconds=60, start=1, maximum=4, cores=lambda t: 4.0, fetch_per_s=fetch, burst=16
    )
    assert Counter(threads[150:300]).most_common(1)[0][0] == 4, threads[150:300]
    assert rate(decoded, 15, 30) >= 0.95 * 1000
    assert settled(threads, 40)[0] <= 2, threads[300:]
    assert rate(decoded, 40, 60) >= 0.97 * 200


@pytest.mark.parametrize("seed", range(5))
def test_it_settles_whatever_the_noise(seed):
    threads, _ = simulate(
        seconds=60,
        start=2,
        maximum=8,
        cores=lambda t: 3.0,
        fetch_per_s=lambda t: 5000,
        seed=seed,
    )
    changes = sum(a != b for a, b in itertools.pairwise(threads[200:]))
    # Probes past the cores at most once per hold, each undone: two changes per hold.
    assert changes <= 2 * (40 / HOLD_S) + 2, threads[200:]
    assert settled(threads, 20)[0] == 3


@pytest.mark.parametrize("burst", [8, 32])
def test_bursts_of_arrivals_are_no_bottleneck_and_idle_threads_are_given_back(burst):
    # A batch's GETs land together: samples wait for a thread at most job starts, yet two
    # threads keep up with 300 samples/s.
    threads, decoded = simulate(
        seconds=40,
        start=8,
        maximum=8,
        cores=lambda t: 8.0,
        fetch_per_s=lambda t: 300,
        burst=burst,
    )
    assert max(threads) == 8 and settled(threads, 20)[0] <= 3, threads
    assert rate(decoded, 20, 40) >= 0.95 * 300


def test_a_paced_pipeline_never_climbs():
    # The consumer (or the store) sets the pace at 256 samples/s, in bursts of a batch.
    threads, _ = simulate(
        seconds=60,
        start=2,
        maximum=8,
        cores=lambda t: 8.0,
        fetch_per_s=lambda t: 256,
        burst=32,
        seed=3,
    )
    assert max(threads) == 2, threads


def test_start_up_and_pauses_do_not_count_as_slow_decoding():
    # Two free cores, decoding the bottleneck, but nothing arrives for the first 3 s
    # (workers starting) and for 15 s in every 40 (a validation pass, a checkpoint).
    def fetch(t: float) -> float:
        return 0 if t < 3 or t % 40 >= 25 else 5000

    threads, decoded = simulate(
        seconds=160, start=2, maximum=8, cores=lambda t: 2.0, fetch_per_s=fetch
    )
    assert max(threads) <= 3, threads
    assert rate(decoded, 5, 25) >= 0.95 * 500


def test_on_many_free_cores_the_climb_goes_on_to_the_share():
    # 32 free cores, 4 ms per image: one more thread adds little in share, but still pays.
    threads, decoded = simulate(
        seconds=60,
        start=8,
        maximum=32,
        cores=lambda t: 32.0,
        fetch_per_s=lambda t: 20000,
        depth=1024,
    )
    assert settled(threads, 50)[0] >= 28, threads
    assert rate(decoded, 50, 60) >= 0.85 * 8000


def test_start_and_maximum_are_checked():
    with pytest.raises(ValueError, match="1 <= start <= maximum"):
        ThreadController(3, 2)
    with pytest.raises(ValueError, match="1 <= start <= maximum"):
        ThreadController(0, 2)
