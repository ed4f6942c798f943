import asyncio

from concurrent_loader.fetch.limits import AdaptiveLimit


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
