"""RunnerSlots: counts readable at any time, FIFO hand-off, cancel-safe."""

from __future__ import annotations

import asyncio

import pytest

from kovanex.runner import RunnerSlots
from tests.agentkit import until


def test_counts_and_fifo_handoff() -> None:
    async def main() -> list[str]:
        slots = RunnerSlots(2)
        assert (slots.free, slots.used) == (2, 0)
        order: list[str] = []
        release = {n: asyncio.Event() for n in "abcd"}

        async def job(name: str) -> None:
            async with slots:
                order.append(name)
                await release[name].wait()

        tasks = [asyncio.create_task(job(n)) for n in "abcd"]
        await until(lambda: len(order) == 2 and slots.waiting == 2)
        assert (slots.free, slots.used, slots.waiting) == (0, 2, 2)
        assert not slots.try_acquire()
        release["a"].set()
        await tasks[0]
        await until(lambda: len(order) == 3)
        assert order == ["a", "b", "c"] and slots.used == 2
        for n in "bcd":
            release[n].set()
        await asyncio.gather(*tasks)
        assert (slots.free, slots.used) == (2, 0)
        return order

    assert asyncio.run(main()) == ["a", "b", "c", "d"]


def test_cancelled_waiter_takes_no_slot() -> None:
    async def main() -> None:
        slots = RunnerSlots(1)
        assert slots.try_acquire()
        waiter = asyncio.create_task(slots.acquire())
        await until(lambda: slots.waiting == 1)
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        slots.release()
        assert (slots.free, slots.used, slots.waiting) == (1, 0, 0)
        # A waiter cancelled right after being handed the slot gives it back.
        assert slots.try_acquire()
        waiter = asyncio.create_task(slots.acquire())
        await until(lambda: slots.waiting == 1)
        slots.release()
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        assert (slots.free, slots.used) == (1, 0)

    asyncio.run(main())


def test_misuse() -> None:
    with pytest.raises(ValueError):
        RunnerSlots(-1)
    none = RunnerSlots(0)  # SERVER/STORAGE nodes: a valid pool that never hands out a slot
    assert (none.total, none.free, none.try_acquire()) == (0, 0, False)
    with pytest.raises(RuntimeError):
        RunnerSlots(1).release()
