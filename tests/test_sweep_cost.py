"""Idle cost does not grow with history (ADR 0030): the sweep reads the tasks it handed
leases to, not every task; the lease-holder backstop reads only those; a write that
bypassed hooks and watcher is still found. Counted with a counter around the real store."""

from __future__ import annotations

import asyncio
import collections
from pathlib import Path
from typing import Any

from bench.seed import seed
from kovanex.agent.dispatch import Sweeper
from kovanex.agent.failover import Failover
from kovanex.agent.scheduling import TaskLocks
from kovanex.net.gossip import GossipNode
from kovanex.net.transport import MemoryNetwork, MemoryTransport
from tests.agentkit import git, wait_for
from tests.test_agent_services import Node, submit


def count_calls(obj: Any, names: list[str]) -> collections.Counter:
    """Wrap `obj`'s methods so each call is counted; the real method still does the work."""
    seen: collections.Counter = collections.Counter()
    for name in names:
        real = getattr(obj, name)

        def counted(*a: Any, _real: Any = real, _name: str = name, **kw: Any) -> Any:
            seen[_name] += 1
            return _real(*a, **kw)

        setattr(obj, name, counted)
    return seen


def idle_sweep_reads(tmp_path: Path, finished: int) -> collections.Counter:
    """Reads done by one sweep of an idle repo holding `finished` finished tasks and one
    task in flight, after the first (full) sweep."""
    n = Node(tmp_path / f"n{finished}")
    seed(n.repos.path("r"), finished)
    submit(n.led, "live")
    store = n.led.store
    seen = count_calls(store, ["refs", "get_ref", "read_commit", "walk"])

    async def go() -> collections.Counter:
        gossip = GossipNode("n1", "lan", transport=MemoryTransport(MemoryNetwork()))
        await gossip.start()
        failover = Failover(n.ctx, n.repos, TaskLocks(), gossip)
        failover.tracked = lambda: list(n.sched.active)
        sweeper = Sweeper(n.repos, n.sched, lambda repo: None, failover.fence_failed_holders)
        n.runs.slots.try_acquire()  # no free slot: the live task stays queued, in flight
        await sweeper.sweep()  # the first sweep lists every task ref once
        assert n.sched.active == {("r", "live")}
        wait_for(lambda: n.repos.ref_stamp("r") is not None, 10, "ref store settled")
        await sweeper.sweep()  # takes the settled stamp
        seen.clear()
        await sweeper.sweep()
        out = collections.Counter(seen)
        # a task ref written behind the agent's back (no hook, no watcher) is still found
        tip = n.led.tip("old0")
        git("--git-dir", str(n.repos.path("r")), "update-ref", "refs/heads/task/sneaky", tip)
        await sweeper.sweep()
        assert n.sched.tips.get(("r", "sneaky")) == tip
        await gossip.close()
        return out

    return asyncio.run(go())


def test_an_idle_sweep_reads_the_tasks_in_flight_not_the_history(tmp_path: Path) -> None:
    small = idle_sweep_reads(tmp_path, 10)
    big = idle_sweep_reads(tmp_path, 1000)
    assert small == big  # the same reads with 10 or 1,000 finished tasks
    assert big["refs"] == 0  # no listing of every task ref
    assert big["get_ref"] <= 3  # the live task's tip, for the sweep and the backstop
    assert big["walk"] == 0


def test_a_start_reads_the_tips_of_finished_tasks_not_their_histories(tmp_path: Path) -> None:
    n = Node(tmp_path / "n1")
    seed(n.repos.path("r"), 300)
    submit(n.led, "live")
    seen = count_calls(n.led.store, ["walk", "read_commit"])
    n.runs.slots.try_acquire()  # nothing starts: the live task stays queued
    asyncio.run(n.sched.reconcile_all())
    assert n.sched.active == {("r", "live")}
    assert len(n.sched.tips) == 301 and n.sched.tips[("r", "old7")] == n.led.tip("old7")
    assert seen["walk"] <= 2  # the live task's history, not the 300 finished ones
    assert len(n.led._views) <= 1


def test_a_start_over_a_big_repo_parses_its_tips_in_a_child_process(
    tmp_path: Path, monkeypatch: Any
) -> None:
    """Issue 11 (ADR 0043): the first pass over a big repo runs in a child process, so its
    parse's churn never reaches the agent's heap. The agent's own `read_tips` is counted
    (the real one still runs if called); the child is a fresh interpreter, not counted."""
    from kovanex.gitstate import archive, tipscan

    n = Node(tmp_path / "n1")
    seed(n.repos.path("r"), tipscan.CHILD_ABOVE + 100)
    submit(n.led, "live")
    seen = count_calls(archive, ["read_tips"])
    n.runs.slots.try_acquire()  # nothing starts: the live task stays queued
    asyncio.run(n.sched.reconcile_all())
    assert seen["read_tips"] == 0, "the first pass parsed every tip in the agent's process"
    assert n.sched.active == {("r", "live")}
    assert len(n.sched.tips) == tipscan.CHILD_ABOVE + 101
    assert n.sched.tips[("r", "old7")] == n.led.tip("old7")
    assert n.sched.core.pending.keys() == {("r", "live")}
