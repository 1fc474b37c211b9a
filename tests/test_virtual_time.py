"""Virtual time: the agent's services sleep and time out on the clock they are given, and
`kovanex.testing.VirtualTimeLoop` jumps to the next timer when every task is blocked, so a
minute of a service's life passes in a fraction of a second of wall time."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

from kovanex.agent.healthsvc import HealthService
from kovanex.core.gossip_profiles import profile
from kovanex.net.gossip import GossipNode
from kovanex.net.transport import MemoryNetwork, MemoryTransport
from kovanex.testing import FakeClock, VirtualTimeLoop, run_virtual

WALL_BOUND_S = 10.0  # generous on a loaded host; the real-time runs below take 5+ minutes


async def yielded_until(cond: Callable[[], bool], rounds: int = 1000) -> bool:
    """Let the loop run ready callbacks (no time passes) until `cond` holds."""
    for _ in range(rounds):
        if cond():
            return True
        await asyncio.sleep(0)
    return cond()


def health(tmp_path: Path, clock: FakeClock) -> HealthService:
    return HealthService(
        tmp_path,
        runner_total_fn=lambda: 2,
        runner_free_fn=lambda: 2,
        queue_depth_fn=lambda: 0,
        interval_s=60.0,
        clock=clock,
    )


def test_a_service_with_a_60s_timer_lives_five_minutes_in_under_a_second(tmp_path: Path) -> None:
    clock = FakeClock()
    svc = health(tmp_path, clock)

    async def five_samples() -> list[float]:
        stop = asyncio.Event()
        task = asyncio.create_task(svc.run(stop))
        while len(svc) < 5:
            await clock.sleep(1.0)  # the test's own waits are virtual too
        stop.set()
        await task
        return [float(t) for t in svc._matrix.times()]

    t0 = time.monotonic()
    times = run_virtual(five_samples(), clock, wall_limit_s=WALL_BOUND_S)
    wall = time.monotonic() - t0
    assert [round(b - a, 6) for a, b in zip(times[:-1], times[1:], strict=True)] == [60.0] * 4
    assert clock.time() - times[0] >= 240.0  # four intervals passed on the service's clock
    assert wall < WALL_BOUND_S / 2, f"{wall:.2f}s of wall time for 4 minutes of timers"


def test_a_service_waits_on_its_injected_clock_not_on_real_time(tmp_path: Path) -> None:
    """On an ordinary loop a FakeClock only moves when told: the health loop's next sample
    comes when (and only when) the fake clock passes 60 s, however fast real time runs."""
    clock = FakeClock()
    svc = health(tmp_path, clock)

    async def go() -> None:
        stop = asyncio.Event()
        task = asyncio.create_task(svc.run(stop))
        assert await yielded_until(lambda: len(svc) == 1)
        clock.advance(59.9)
        assert not await yielded_until(lambda: len(svc) > 1, rounds=200)
        clock.advance(0.1)
        assert await yielded_until(lambda: len(svc) == 2), "the 60 s timer did not fire"
        stop.set()
        clock.advance(60.0)
        await asyncio.wait_for(task, 5.0)  # the test's own real-time guard

    asyncio.run(go())
    times = svc._matrix.times()
    assert float(times[1] - times[0]) == 60.0


def test_the_gossip_failure_detector_declares_a_crashed_node_dead_in_virtual_time() -> None:
    """The seed profile (probe every 30 s, suspect for 30 s) takes a minute or more of real
    time to declare a crash; over the virtual loop the same core, timers and transport do it
    at once, and the virtual time it took is the profile's."""
    seed = profile("seed")
    clock = FakeClock()

    async def go() -> tuple[float, list[str]]:
        net = MemoryNetwork()
        nodes = []
        for i in range(3):
            g = GossipNode(
                f"g{i}", seed, None, {}, transport=MemoryTransport(net), seed=i, clock=clock
            )
            await g.start(("127.0.0.1", 0))
            nodes.append(g)
        for g in nodes[1:]:
            assert await g.join([nodes[0].addr]) == 1

        def statuses(of: str) -> list[str | None]:
            return [{m.name: m.status for m in g.members()}.get(of) for g in nodes[:2]]

        assert await nodes[0].wait_for(lambda: statuses("g2") == ["alive", "alive"], 600)
        failed: list[str] = []
        nodes[0].subscribe("member-failed", lambda _t, m: failed.append(m.name))
        t0 = clock.monotonic()
        await nodes[2].close()  # a crash: no leave message
        dead = await nodes[0].wait_for(lambda: statuses("g2") == ["dead", "dead"], 3600)
        took = clock.monotonic() - t0
        for g in nodes[:2]:
            await g.close()
        assert dead, f"g2 still {statuses('g2')} after {took:.0f} virtual s"
        return took, failed

    t0 = time.monotonic()
    took, failed = run_virtual(go(), clock, wall_limit_s=WALL_BOUND_S)
    wall = time.monotonic() - t0
    assert failed == ["g2"]
    # at least the fixed suspicion; at most a few probe rounds plus it
    assert (
        seed.fixed_suspicion_timeout
        <= took
        <= 4 * seed.probe_interval + 2 * seed.fixed_suspicion_timeout
    )
    assert wall < WALL_BOUND_S / 2, f"{wall:.2f}s of wall time"


def test_real_work_holds_virtual_time_to_real_time() -> None:
    """A thread or a child process works in real time: while one runs the loop must not
    jump, or a `wait_for(git, 30)` would time out at once."""

    async def go(clock: FakeClock) -> tuple[float, float]:
        t0 = clock.monotonic()
        await clock.wait_for(asyncio.to_thread(time.sleep, 0.2), 30.0)
        in_thread = clock.monotonic() - t0
        t1 = clock.monotonic()
        proc = await asyncio.create_subprocess_exec("sleep", "0.2")
        await clock.wait_for(proc.wait(), 30.0)
        return in_thread, clock.monotonic() - t1

    clock = FakeClock()
    in_thread, in_child = run_virtual(go(clock), clock)
    assert 0.1 <= in_thread < 5.0 and 0.1 <= in_child < 5.0  # real seconds, not a jump to 30


def test_the_loop_reads_the_clock_it_was_given() -> None:
    clock = FakeClock(mono=5000.0)
    loop = VirtualTimeLoop(clock)
    try:
        assert loop.time() == 5000.0 and loop.clock is clock
        clock.advance(7.0)
        assert loop.time() == 5007.0
    finally:
        loop.close()


def test_gossip_runs_on_its_injected_clock() -> None:
    """On an ordinary loop, gossip given an unbound FakeClock probes and suspects only as
    that clock moves: stepping it through the seed profile's minute declares the crashed
    node dead, in a few ms of real time in which a real-time timer would never fire."""
    seed = profile("seed")
    clock = FakeClock()

    async def go() -> float:
        net = MemoryNetwork()
        nodes = [
            GossipNode(f"g{i}", seed, None, {}, transport=MemoryTransport(net), seed=i, clock=clock)
            for i in range(3)
        ]
        for g in nodes:
            await g.start(("127.0.0.1", 0))
        for g in nodes[1:]:
            assert await g.join([nodes[0].addr]) == 1

        def g2_is(status: str) -> bool:
            return all({m.name: m.status for m in g.members()}.get("g2") == status
                       for g in nodes[:2])  # fmt: skip

        async def stepped_until(cond: Callable[[], bool], limit: float) -> None:
            t0 = clock.monotonic()
            while not cond() and clock.monotonic() - t0 < limit:
                clock.advance(1.0)
                await yielded_until(lambda: False, rounds=20)  # let the woken callbacks run

        await stepped_until(lambda: g2_is("alive"), 120)
        assert g2_is("alive"), "gossip did not spread on the fake clock"
        await nodes[2].close()
        t0 = clock.monotonic()
        await stepped_until(lambda: g2_is("dead"), 600)
        for g in nodes[:2]:
            await g.close()
        assert g2_is("dead"), "the crash was not detected on the fake clock"
        return clock.monotonic() - t0

    took = asyncio.run(go())
    assert (
        seed.fixed_suspicion_timeout
        <= took
        <= 4 * seed.probe_interval + 2 * seed.fixed_suspicion_timeout
    )
