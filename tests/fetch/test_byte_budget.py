"""ByteBudget alone: what is admitted, in which order, and who wakes whom.

Tests drive the budget from the event loop (``call_soon`` is the loop's own), except the one
about releases from other threads, and wait for hand-overs by letting the loop turn, never
by sleeping.
"""

from __future__ import annotations

import asyncio
import random
import threading

import pytest

from concurrent_loader.fetch import ByteBudget


async def turns(n: int = 10) -> None:
    """Let every ready task and callback run ``n`` times over."""
    for _ in range(n):
        await asyncio.sleep(0)


def on_loop(max_bytes: int) -> ByteBudget:
    return ByteBudget(max_bytes, asyncio.get_running_loop().call_soon)


def test_max_bytes_must_be_positive():
    with pytest.raises(ValueError):
        ByteBudget(0, lambda callback: None)


def test_first_reservation_of_unknown_size_goes_alone():
    async def main() -> None:
        budget = on_loop(100)
        first = await budget.reserve()
        assert first == 100 and budget.reserved == 100
        second = asyncio.create_task(budget.reserve())
        await turns()
        assert not second.done()
        budget.settle(first, 10)  # now the mean size is known: 10
        await turns()
        assert second.done() and second.result() == 10
        assert (budget.held, budget.reserved) == (10, 10)

    asyncio.run(main())


def test_with_size_hints_several_fit():
    async def main() -> None:
        budget = on_loop(100)
        reserved = [await budget.reserve(30) for _ in range(3)]
        assert reserved == [30, 30, 30] and budget.reserved == 90
        fourth = asyncio.create_task(budget.reserve(30))
        await turns()
        assert not fourth.done()
        budget.settle(30, 30)
        await turns()
        assert not fourth.done()  # held 30 + reserved 60: one more does not fit
        budget.release(30)
        await turns()
        assert fourth.done() and budget.reserved == 90 and budget.held == 0

    asyncio.run(main())


def test_an_object_larger_than_the_budget_is_admitted_when_nothing_else_is_committed():
    async def main() -> None:
        budget = on_loop(10)
        assert await budget.reserve(100) == 100
        small = asyncio.create_task(budget.reserve(1))
        await turns()
        assert not small.done()
        budget.settle(100, 100)
        budget.release(100)
        await turns()
        assert small.done()

    asyncio.run(main())


def test_waiters_are_admitted_in_arrival_order_even_if_a_later_one_would_fit():
    async def main() -> None:
        budget = on_loop(100)
        budget.settle(await budget.reserve(100), 100)  # 100 held
        admitted: list[str] = []

        async def one(name: str, size: int) -> None:
            await budget.reserve(size)
            admitted.append(name)

        tasks = []
        for name, size in [("a", 60), ("b", 10), ("c", 30)]:
            tasks.append(asyncio.create_task(one(name, size)))
            await turns(1)
        budget.release(50)  # 50 free: "b" would fit, but "a" is first in line
        await turns()
        assert admitted == []
        budget.release(50)
        await asyncio.gather(*tasks)
        assert admitted == ["a", "b", "c"]
        assert budget.reserved == 100

    asyncio.run(main())


def test_a_waiter_cancelled_while_waiting_leaves_the_line():
    async def main() -> None:
        budget = on_loop(100)
        reserved = await budget.reserve(100)
        first = asyncio.create_task(budget.reserve(50))
        second = asyncio.create_task(budget.reserve(50))
        await turns()
        first.cancel()
        await asyncio.gather(first, return_exceptions=True)
        budget.cancel(reserved)
        await turns()
        assert second.done() and budget.reserved == 50

    asyncio.run(main())


def test_a_waiter_cancelled_after_its_turn_came_passes_the_turn_on():
    async def main() -> None:
        budget = on_loop(100)
        reserved = await budget.reserve(100)
        first = asyncio.create_task(budget.reserve(50))
        second = asyncio.create_task(budget.reserve(50))
        await turns()
        budget.cancel(reserved)  # wakes ``first`` at once; it has not run yet
        first.cancel()
        await asyncio.gather(first, return_exceptions=True)
        await turns()
        assert first.cancelled()
        assert second.done() and budget.reserved == 50

    asyncio.run(main())


def test_a_release_from_another_thread_wakes_the_loop():
    async def main() -> None:
        loop = asyncio.get_running_loop()
        budget = ByteBudget(100, loop.call_soon_threadsafe)
        budget.settle(await budget.reserve(100), 100)
        waiter = asyncio.create_task(budget.reserve(50))
        await turns()
        assert not waiter.done()
        # Nothing else is scheduled: only the release can wake the (idle) loop.
        releaser = threading.Thread(target=budget.release, args=(100,))
        releaser.start()
        assert await asyncio.wait_for(waiter, timeout=30) == 50
        releaser.join()

    asyncio.run(main())


def test_close_wakes_every_waiter():
    async def main() -> None:
        budget = on_loop(100)
        await budget.reserve(100)
        waiters = [asyncio.create_task(budget.reserve(50)) for _ in range(3)]
        await turns()
        assert not any(w.done() for w in waiters)
        budget.close()
        await turns()
        assert all(w.done() for w in waiters)

    asyncio.run(main())


def test_committed_bytes_stay_within_the_budget_under_random_traffic():
    """With every size known, ``held + reserved`` never exceeds ``max_bytes``."""
    rng = random.Random(20240607)
    sizes = [rng.randint(1, 40) for _ in range(200)]

    async def main() -> int:
        budget = on_loop(100)
        peak = 0

        def check() -> None:
            nonlocal peak
            peak = max(peak, budget.held + budget.reserved)

        async def body(size: int, pauses: tuple[int, int]) -> None:
            reserved = await budget.reserve(size)
            check()
            await turns(pauses[0])
            budget.settle(reserved, size)
            check()
            await turns(pauses[1])
            budget.release(size)

        await asyncio.gather(
            *(body(size, (rng.randint(0, 5), rng.randint(0, 5))) for size in sizes)
        )
        assert (budget.held, budget.reserved) == (0, 0)
        return peak

    peak = asyncio.run(main())
    assert 60 < peak <= 100


def test_a_newcomer_does_not_overtake_a_waiter_whose_turn_came():
    async def main() -> None:
        budget = on_loop(100)
        reserved = await budget.reserve(100)
        earlier = asyncio.create_task(budget.reserve(60))
        await turns()
        later = asyncio.create_task(budget.reserve(60))  # ready to run, not run yet
        budget.cancel(reserved)  # the turn goes to ``earlier``
        await turns()
        assert earlier.done() and not later.done()
        later.cancel()
        await asyncio.gather(later, return_exceptions=True)

    asyncio.run(main())


def test_waiters_woken_together_that_do_not_fit_keep_their_order():
    async def main() -> None:
        budget = on_loop(100)
        for _ in range(4):
            budget.settle(await budget.reserve(25), 25)  # 100 held
        admitted: list[str] = []

        async def one(name: str) -> None:
            await budget.reserve(80)
            admitted.append(name)

        first = asyncio.create_task(one("first"))
        await turns(1)
        second = asyncio.create_task(one("second"))
        await turns()
        budget.release(25)  # two decodes finish: both waiters are woken,
        budget.release(25)  # and 50 held + 80 fits for neither
        await turns()
        assert admitted == []
        budget.release(50)  # all free: the first in line goes first
        await turns()
        assert admitted == ["first"]
        second.cancel()
        await asyncio.gather(first, second, return_exceptions=True)

    asyncio.run(main())
