"""One contract for both clocks: what a service may assume of the time it is given."""

from __future__ import annotations

import asyncio

import pytest

from kovanex.clock import SYSTEM, Clock, settled
from kovanex.testing import FakeClock, run_virtual


@pytest.fixture(params=["system", "fake"])
def clock(request: pytest.FixtureRequest) -> Clock:
    return SYSTEM if request.param == "system" else FakeClock()


def test_monotonic_never_goes_back(clock: Clock) -> None:
    seen = [clock.monotonic() for _ in range(1000)]
    assert seen == sorted(seen)


def test_wall_time_is_seconds_since_the_epoch(clock: Clock) -> None:
    assert 1.6e9 < clock.time() < 4.1e9  # 2020..2099


def test_a_fake_clock_moves_only_when_told_and_never_back() -> None:
    c = FakeClock()
    t, m = c.time(), c.monotonic()
    assert (c.time(), c.monotonic()) == (t, m)
    c.advance(2.5)
    assert (c.time() - t, c.monotonic() - m) == (2.5, 2.5)
    with pytest.raises(ValueError):
        c.advance(-1)


# -- sleeps and timers: the order a service sees is the same on every clock ----------------

EXPECTED = ["wait_for 0.5", "sleep 1", "sleep 2", "timer 2.5", "sleep 3", "timeout 3.5"]


async def timeline(clock: Clock, unit: float) -> tuple[list[str], float]:
    """Sleeps, a timer, a cancelled timer, a wait_for that returns and one that times out,
    all started at once; the order they finish in and the time it took on `clock`."""
    out: list[str] = []
    t0 = clock.monotonic()

    async def sleeper(n: float) -> None:
        await clock.sleep(n * unit)
        out.append(f"sleep {n:g}")

    async def quick() -> str:
        await clock.sleep(0.5 * unit)
        return "wait_for 0.5"

    async def waits() -> None:
        out.append(await clock.wait_for(quick(), 4 * unit))
        try:
            await clock.wait_for(asyncio.Event().wait(), 3.5 * unit)
            out.append("never")
        except TimeoutError:
            out.append("timeout 3.5")

    clock.call_later(2.5 * unit, out.append, "timer 2.5")
    clock.call_later(1.5 * unit, out.append, "cancelled").cancel()
    await asyncio.gather(sleeper(3), sleeper(1), sleeper(2), waits())
    return out, clock.monotonic() - t0


def test_the_system_clock_orders_sleeps_and_timers_by_their_time() -> None:
    # Real time: the timer is set before the sleeps start, and a loaded host (`make test`
    # runs workers in parallel) can pause the loop between them. The closest two events are
    # half a unit apart, so the unit must dwarf a pause: 0.05 s (25 ms) reordered them there.
    unit = 0.4
    order, took = asyncio.run(timeline(SYSTEM, unit))
    assert order == EXPECTED and took >= 4 * unit  # the timeout starts after the 0.5


def test_the_virtual_loop_orders_them_as_the_system_clock_does() -> None:
    clock = FakeClock()
    order, took = run_virtual(timeline(clock, 60.0), clock, wall_limit_s=10.0)
    assert order == EXPECTED and took == pytest.approx(4 * 60.0)


def test_an_unbound_fake_clock_orders_them_as_the_system_clock_does() -> None:
    """Unbound, the fake clock's timers fire only in `advance`, each at its own time."""
    clock = FakeClock()

    async def driven() -> tuple[list[str], float]:
        run = asyncio.ensure_future(timeline(clock, 60.0))
        for _ in range(20):  # 20 steps of 15 s: past the last timer at 240 s
            for _ in range(10):
                await asyncio.sleep(0)  # let the woken tasks run and set their next timers
            clock.advance(15.0)
        return await asyncio.wait_for(run, 5.0)

    order, took = asyncio.run(driven())
    assert order == EXPECTED and took >= 4 * 60.0


def test_settled_waits_bounded_never_raises_and_never_cancels() -> None:
    """The clock's `asyncio.wait(tasks, timeout=)`: what the agent's stop and the leader's
    sync use to give tasks a bounded while to end."""

    async def go(clock: Clock) -> tuple[float, bool, bool]:
        async def fails() -> None:
            raise ValueError("its error stays in the task")

        slow = asyncio.ensure_future(asyncio.Event().wait())
        failing = asyncio.ensure_future(fails())
        t0 = clock.monotonic()
        await settled(clock, {failing}, 60.0)  # ends at once, does not raise
        quick = clock.monotonic() - t0
        await settled(clock, {slow}, 60.0)
        took = clock.monotonic() - t0
        alive = not slow.done()
        slow.cancel()
        return quick, took >= 60.0, alive and isinstance(failing.exception(), ValueError)

    clock = FakeClock()
    quick, waited, kept = run_virtual(go(clock), clock, wall_limit_s=10.0)
    assert quick == 0.0 and waited and kept
