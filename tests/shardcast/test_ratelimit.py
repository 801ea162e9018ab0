import asyncio
import time

import pytest

from meshrl.shardcast.ratelimit import TokenBucket

from .conftest import run


@pytest.mark.timing
def test_rate_is_held_from_the_first_byte():
    async def main():
        bucket = TokenBucket(rate=2_000_000, burst=100_000)
        t0 = time.monotonic()
        for _ in range(40):  # 40 x 25 kB = 1 MB at 2 MB/s: 0.5 s
            await bucket.take(25_000)
        return time.monotonic() - t0

    dt = run(main())
    assert 0.475 <= dt < 0.6  # the bucket starts empty; only a late wake-up can add time


def test_high_priority_waiters_go_first_and_low_ones_time_out():
    async def main():
        bucket = TokenBucket(rate=1_000_000, burst=20_000)
        order: list[str] = []

        async def taker(name, high, timeout=None):
            await bucket.take(20_000, high=high, timeout=timeout)
            order.append(name)

        # 0.2 s in debt: everyone after this must queue, even on a loop a loaded machine delays
        # (20 ms of debt was repaid before the next take there: it was granted, not queued)
        await bucket.take(200_000)
        low = asyncio.create_task(taker("low", False))
        # fixed-sleep-ok: one turn of the loop, not a time: `low` runs to its first wait, queued
        await asyncio.sleep(0)
        highs = [asyncio.create_task(taker(f"high{i}", True)) for i in range(3)]
        await asyncio.gather(low, *highs)
        busy_after_highs, first = bucket.high_waited(0.5), list(order)
        await bucket.take(200_000)  # in debt again: the relay queues, and is granted first
        with pytest.raises(TimeoutError):  # starved behind a relay: gives up, leaves the queue
            await asyncio.gather(taker("relay", True), taker("late", False, timeout=0.001))
        # fixed-sleep-ok: the time is under test: `high_waited`'s 10 ms window has passed
        await asyncio.sleep(0.05)
        return first, busy_after_highs, bucket.high_waited(0.01)

    order, busy, busy_later = run(main())
    assert order == ["high0", "high1", "high2", "low"]  # the low taker queued first, yet last
    assert busy and not busy_later


def test_bad_rates_are_refused():
    with pytest.raises(ValueError):
        TokenBucket(0, 1)


def test_low_waiters_are_served_furthest_behind_first():
    async def main():
        bucket = TokenBucket(rate=1_000_000, burst=10_000)
        await bucket.take(10_000)
        order: list[float] = []

        async def client(progress):
            await bucket.take(10_000, rank=progress)
            order.append(progress)

        await asyncio.gather(*(client(p) for p in (0.5, 0.1, 0.9, 0.3)))
        return order

    assert run(main()) == [0.1, 0.3, 0.5, 0.9]


@pytest.mark.parametrize(("claim", "rank"), [("0.25", 0.25), ("7", 1.0), ("-1", 0.0),
                                             ("nan", 0.0), ("inf", 0.0), ("half", 0.0)])
def test_claimed_progress_is_clamped_to_a_rank(claim, rank):
    from aiohttp.test_utils import make_mocked_request

    from meshrl.shardcast.server import _progress
    from meshrl.shardcast.transport import PROGRESS_HEADER

    request = make_mocked_request("GET", "/v/1/shard/0", headers={PROGRESS_HEADER: claim})
    assert _progress(request) == rank


def test_a_client_behind_other_clients_waits_but_never_times_out():
    async def main():
        bucket = TokenBucket(rate=1_000_000, burst=10_000)
        await bucket.take(10_000)

        async def behind():  # 5 x 20 kB at rank 0: 0.1 s ahead of the patient one
            for _ in range(5):
                await bucket.take(20_000, rank=0.0)

        async def patient():  # queued right after `behind`'s first take (gather's order)
            await bucket.take(20_000, rank=0.9, timeout=0.02)
            return "served"

        _, result = await asyncio.gather(behind(), patient())
        return result

    assert run(main()) == "served"
