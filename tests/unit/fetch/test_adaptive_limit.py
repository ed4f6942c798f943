"""AdaptiveLimit alone: holders bounded by ``limit``, AIMD on throttles, FIFO hand-over."""

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


def test_throttles_halve_the_limit_down_to_one():
    limit = AdaptiveLimit(8, cooldown=3600)

    async def main() -> list[int]:
        seen = []
        for _ in range(5):
            await limit.acquire()
            limit.release(throttled=True)
            seen.append(limit.limit)
        return seen

    assert asyncio.run(main()) == [4, 2, 1, 1, 1]
    assert limit.throttles == 5 and limit.in_flight == 0


def test_successes_after_the_cooldown_add_one_up_to_the_maximum():
    limit = AdaptiveLimit(4, cooldown=0.0)

    async def main() -> list[int]:
        await limit.acquire()
        limit.release(throttled=True)
        seen = [limit.limit]
        for _ in range(4):
            await limit.acquire()
            limit.release()
            seen.append(limit.limit)
        return seen

    assert asyncio.run(main()) == [2, 3, 4, 4, 4]


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
    limit = AdaptiveLimit(4, cooldown=3600)

    async def main() -> None:
        for _ in range(4):
            await limit.acquire()
        waiter = asyncio.create_task(limit.acquire())
        await turns()
        limit.release(throttled=True)  # limit 2, 3 holders
        await turns()
        assert not waiter.done()
        limit.release()  # 2 holders: still none free
        await turns()
        assert not waiter.done()
        limit.release()  # 1 holder
        await turns()
        assert waiter.done() and limit.in_flight == 2

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
