"""A remote run that crashes (e.g. the owner unreachable for a moment after a heal) is
started again from its assignment, at most `REDELIVER_MAX` times; then its lease goes back
to the owner. Before, nothing restarted it: the owner never re-places a lease whose
holder is alive (found by tests/test_partition_nats.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from kovanex import config as cfgmod
from kovanex.agent import remoterun
from kovanex.agent.context import NodeContext
from kovanex.agent.remoterun import RemoteRuns
from kovanex.agent.runs import RunTable
from kovanex.agent.scheduling import TaskLocks
from kovanex.core.gossip_profiles import profile
from kovanex.gitstate.ledger import Lease
from kovanex.net.gossip import GossipNode
from kovanex.net.transport import MemoryNetwork, MemoryTransport
from kovanex.testing import FakeClock


class CrashedRun:
    """What `ran` reads of a run that ended: its lease, and that it crashed."""

    def __init__(self, epoch: int) -> None:
        self.lease = Lease("t1", "n1", epoch, repo="r")
        self.crashed = True


def _remote_runs(tmp_path: Path, g: GossipNode, started: list[dict[str, Any]]) -> RemoteRuns:
    """RemoteRuns on node n1 whose owner-branch read only records the assignment."""
    layout = cfgmod.Layout(tmp_path / "n1")
    ctx = NodeContext(layout, cfgmod.NodeConfig(name="n1"), token="t", clock=FakeClock())
    rr = RemoteRuns(ctx, RunTable(ctx), TaskLocks(), None, g, None)  # type: ignore[arg-type]

    async def start(value: dict[str, Any]) -> None:  # the owner's branch read
        started.append(value)

    rr._start = start  # type: ignore[method-assign]
    return rr


def test_a_crashed_remote_run_is_started_again_then_handed_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(remoterun, "REDELIVER_S", 0.0)
    started: list[dict[str, Any]] = []
    handed: list[tuple[str, str, int, str]] = []

    async def go() -> None:
        g = GossipNode("n1", profile("local"), None, {}, transport=MemoryTransport(MemoryNetwork()))
        await g.start(("127.0.0.1", 0))
        try:
            rr = _remote_runs(tmp_path, g, started)

            async def hand_back(repo: str, task: str, epoch: int, why: str) -> bool:
                handed.append((repo, task, epoch, why))
                return True

            rr.hand_back = hand_back  # type: ignore[method-assign]
            a = {"repo": "r", "task": "t1", "node": "n1", "epoch": 3, "url": "u", "owner": "n2"}
            g.publish("assign", "r/t1", a)
            for crash in range(remoterun.REDELIVER_MAX + 1):
                rr._watched[("r", "t1")] = (CrashedRun(3 + crash), None)  # type: ignore[assignment]
                rr.ran("r", "t1")
                for _ in range(20):  # let the tasks `ran` spawned run (no sleep of time)
                    await asyncio.sleep(0)
        finally:
            await g.close()

    asyncio.run(go())
    assert len(started) == remoterun.REDELIVER_MAX
    assert started[0]["epoch"] == 3
    assert handed == [("r", "t1", 3 + remoterun.REDELIVER_MAX,
                       f"its runs on n1 crashed {remoterun.REDELIVER_MAX} times")]  # fmt: skip


def _started_on_n1(
    tmp_path: Path, act: Callable[[GossipNode, RemoteRuns], None]
) -> list[tuple[str, int]]:
    """`act` on n1's gossip and RemoteRuns (over a MemoryNetwork); then the loop turns
    until the tasks its callbacks spawned have run (turns, not time): what was started."""
    started: list[dict[str, Any]] = []

    async def go() -> None:
        g = GossipNode("n1", profile("local"), None, {}, transport=MemoryTransport(MemoryNetwork()))
        await g.start(("127.0.0.1", 0))
        try:
            act(g, _remote_runs(tmp_path, g, started))
            for _ in range(20):
                await asyncio.sleep(0)
        finally:
            await g.close()

    asyncio.run(go())
    return [(v["task"], v["epoch"]) for v in started]


def test_an_assignment_gossip_held_before_the_service_started_is_run(tmp_path: Path) -> None:
    """The agent joins gossip before RemoteRuns subscribes; an owner that placed a task on
    us the moment we joined sent the assignment into that window. start() delivers it
    (before, nothing did, and the owner excluded us at its 10 s deadline)."""

    def act(g: GossipNode, rr: RemoteRuns) -> None:
        mine = {"repo": "r", "task": "t1", "node": "n1", "epoch": 2, "url": "u", "owner": "n2"}
        g.publish("assign", "r/t1", mine)
        g.publish("assign", "r/t2", {**mine, "task": "t2", "node": "n3"})
        rr.start()

    assert _started_on_n1(tmp_path, act) == [("t1", 2)]


class EndedRun:
    """A run of ours that ended on its own (it stood down when its lease moved)."""

    def __init__(self, epoch: int) -> None:
        self.lease = Lease("t1", "n1", epoch, repo="r")
        self.key = ("r", "t1")
        self.crashed = False
        self.cancel = asyncio.Event()


def test_a_new_assignment_of_a_task_whose_old_run_here_ended_is_started(tmp_path: Path) -> None:
    """Issue 25 bug 9 (KOVANEX_SEED=16): n1 was cut off; its owner re-queued the task, n1's
    run stood down, and after the heal the owner placed it on n1 again under epoch 3. The
    watch of the ended run made that assignment a mere 'verify' of the old run: it never
    started, and the owner excluded n1 at its 10 s deadline, for good."""

    def act(g: GossipNode, rr: RemoteRuns) -> None:
        rr.start()
        rr._watched[("r", "t1")] = (EndedRun(1), None)  # type: ignore[assignment]
        rr.ran("r", "t1")  # it ended: not in the run table
        a = {"repo": "r", "task": "t1", "node": "n1", "epoch": 3, "url": "u", "owner": "n2"}
        g.publish("assign", "r/t1", a)

    assert _started_on_n1(tmp_path, act) == [("t1", 3)]


def test_an_owner_announces_again_what_it_assigned_a_node_that_joins_again() -> None:
    """A lease placed on a node while it was cut off went out in a broadcast that spent its
    retransmits meanwhile; the node would hear of it only at a push-pull, past the
    placement deadline. When it joins again, the owner publishes those keys afresh."""
    from kovanex.agent.assignments import Assignments
    from kovanex.core.remoterun import to_reannounce

    async def go() -> tuple[list[str], dict[str, int], dict[str, int]]:
        g = GossipNode("n2", profile("local"), None, {}, transport=MemoryTransport(MemoryNetwork()))
        await g.start(("127.0.0.1", 0))
        try:
            mine = {"repo": "r", "task": "t1", "node": "n3", "epoch": 2, "url": "u", "owner": "n2"}
            g.publish("assign", "r/t1", mine)
            g.publish("assign", "r/t2", {**mine, "task": "t2", "node": "n4"})
            g.publish("assign", "s/t1", {**mine, "repo": "s", "owner": "n5"})  # not ours
            before = {k: e.version for (t, k), e in g.core.app.items() if t == "assign"}
            keys = Assignments("n2", g, lambda: "u").rejoined("n3")
            after = {k: e.version for (t, k), e in g.core.app.items() if t == "assign"}
            return keys, before, after
        finally:
            await g.close()

    keys, before, after = asyncio.run(go())
    assert keys == ["r/t1"]
    assert after["r/t1"] > before["r/t1"]  # a new version: a fresh broadcast
    assert after["r/t2"] == before["r/t2"] and after["s/t1"] == before["s/t1"]
    assert to_reannounce({"k": None, "j": "junk"}, "n2", "n3") == []
