"""AdaptiveLimit alone: holders bounded by ``limit`` (also under concurrent GETs and a round of
throttles), hedge slots beyond it, FIFO hand-over, cancelled waiters, and the wait for a
store that accepts GETs again."""

from __future__ import annotations

import asyncio

import pytest

from concurrent_loader.fetch import AdaptiveLimit


async def turns(n: int = 10) -> None:
    """Let every ready task run ``n`` times over: enough for any hand-over to complete."""
    for _ in range(n):
        await asyncio.sleep(0)


def test_maximum_must_be_positive():
    with pytest.raises(ValueError):
        AdaptiveLimit(0)


def throttle_round(limit: AdaptiveLimit) -> None:
    """A whole round of GETs (as many as the limit) sent, and every one throttled."""
    marks = [limit.sent() for _ in range(limit.limit)]
    for mark in marks:
        limit.done(mark, latency=None, throttled=True)


def test_throttles_cut_the_limit_once_per_round_down_to_the_floor():
    limit = AdaptiveLimit(8)
    seen = []
    for _ in range(4):
        throttle_round(limit)
        seen.append(limit.limit)
    assert seen == [4, 4, 4, 4]  # halved by a round of all throttles, then the floor
    assert limit.throttles == 8 + 4 + 4 + 4 and limit.storming


def test_hedge_slots_are_beyond_the_limit_and_bounded():
    limit = AdaptiveLimit(1, hedges=2)

    async def main() -> None:
        await limit.acquire()
        assert limit.in_flight == 1 == limit.limit
        assert limit.try_acquire_hedge() and limit.try_acquire_hedge()
        assert not limit.try_acquire_hedge()
        limit.release_hedge()
        assert limit.try_acquire_hedge()
        assert limit.hedges_in_flight == 2 and limit.in_flight == 1

    asyncio.run(main())


def test_wait_for_success_ends_when_a_get_succeeds():
    limit = AdaptiveLimit(8)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        started = loop.time()
        waiting = asyncio.create_task(limit.wait_for_success(60))
        await turns()
        throttle_round(limit)  # a throttle wakes no one
        await turns()
        assert not waiting.done()
        limit.done(limit.sent(), latency=0.01)
        await asyncio.wait_for(waiting, 5)
        assert loop.time() - started < 5
        await asyncio.wait_for(limit.wait_for_success(0.01), 5)  # or its time runs out

    asyncio.run(main())


def test_waiters_are_admitted_in_arrival_order():
    limit = AdaptiveLimit(1)
    admitted: list[int] = []

    async def one(i: int) -> None:
        await limit.acquire()
        admitted.append(i)

    async def main() -> None:
        await limit.acquire()
        tasks = []
        for i in range(5):
            tasks.append(asyncio.create_task(one(i)))
            await turns(1)  # queue them in this order
        for i in range(5):
            limit.release()
            await turns()
            assert admitted == list(range(i + 1))
        await asyncio.gather(*tasks)
        limit.release()
        assert limit.in_flight == 0

    asyncio.run(main())


def test_a_lowered_limit_admits_no_one_until_holders_drop_below_it():
    limit = AdaptiveLimit(8)

    async def main() -> None:
        for _ in range(8):
            await limit.acquire()
        waiter = asyncio.create_task(limit.acquire())
        await turns()
        throttle_round(limit)  # limit 4, 8 holders
        assert limit.limit == 4
        for holders in (7, 6, 5, 4):
            limit.release()
            await turns()
            assert not waiter.done(), holders
        limit.release()  # 3 holders: one slot free
        await turns()
        assert waiter.done() and limit.in_flight == 4

    asyncio.run(main())


def test_a_waiter_cancelled_after_being_handed_a_slot_passes_it_on():
    limit = AdaptiveLimit(1)

    async def main() -> None:
        await limit.acquire()
        first = asyncio.create_task(limit.acquire())
        second = asyncio.create_task(limit.acquire())
        await turns()
        limit.release()  # hands the slot to ``first``, which has not run yet
        first.cancel()
        await asyncio.gather(first, return_exceptions=True)
        await turns()
        assert first.cancelled()
        assert second.done() and limit.in_flight == 1
        limit.release()
        assert limit.in_flight == 0

    asyncio.run(main())


def test_a_cancelled_waiter_leaves_the_line():
    limit = AdaptiveLimit(1)

    async def main() -> None:
        await limit.acquire()
        first = asyncio.create_task(limit.acquire())
        second = asyncio.create_task(limit.acquire())
        await turns()
        first.cancel()
        await asyncio.gather(first, return_exceptions=True)
        limit.release()
        await turns()
        assert second.done() and limit.in_flight == 1

    asyncio.run(main())


def test_bounds_holders_and_backs_off_on_throttle():
    async def main():
        limit = AdaptiveLimit(8, cooldown=60)
        peak = 0

        async def one(throttle: bool):
            nonlocal peak
            await limit.acquire()
            peak = max(peak, limit.in_flight)
            mark = limit.sent()
            await asyncio.sleep(0.01)
            limit.done(mark, latency=None if throttle else 0.01, throttled=throttle)
            limit.release()

        await asyncio.gather(*(one(False) for _ in range(40)))
        assert peak == 8 and limit.in_flight == 0
        await asyncio.gather(*(one(True) for _ in range(8)))  # a round of throttles
        assert limit.limit == 4 and limit.throttles == 8
        peak = 0
        await asyncio.gather(*(one(False) for _ in range(40)))
        assert peak <= 4  # within the cool-down: no growth
        assert limit.in_flight == 0

    asyncio.run(main())


def test_cancelled_waiter_does_not_leak_a_slot():
    async def main():
        limit = AdaptiveLimit(1)
        await limit.acquire()
        waiter = asyncio.ensure_future(limit.acquire())
        await asyncio.sleep(0)
        waiter.cancel()
        await asyncio.gather(waiter, return_exceptions=True)
        limit.release()
        assert limit.in_flight == 0
        await asyncio.wait_for(limit.acquire(), 1)

    asyncio.run(main())
