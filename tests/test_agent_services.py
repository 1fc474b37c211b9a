"""The agent's services in process: the placer, the scheduling shell and a TaskRun, on a
real bare repo, with no agent process, no gossip and no HTTP. Each runs in well under a
second, so scheduling and resume decisions no longer need an agent process to test."""

from __future__ import annotations

import asyncio
import subprocess
import time
from pathlib import Path

import pytest

from kovanex import config as cfgmod
from kovanex.agent.context import NodeContext
from kovanex.agent.placement import Placer
from kovanex.agent.repos import RepoIndex
from kovanex.agent.runs import RunTable
from kovanex.agent.scheduling import TaskLocks, TaskScheduler
from kovanex.core import task as taskcore
from kovanex.core.effects import Assign
from kovanex.core.scheduler import Decision
from kovanex.gitstate import TaskLedger
from kovanex.gitstate.ledger import task_ref
from kovanex.gitstate.memory import MemoryStore
from kovanex.testing import FakeClock, node_info

USER = ("Ada", "ada@example.invalid")
SPEC = b"""
[[steps]]
name = "one"
run = "echo one > one.txt"

[[steps]]
name = "two"
run = "test -f one.txt && echo two"
"""


def submit(led: TaskLedger, tid: str, spec: bytes = SPEC) -> str:
    """What a user's push leaves behind: a commit carrying the spec on task/<tid>."""
    s = led.store
    tree = s.tree_with(None, {".kovanex/task.toml": spec})
    c = s.create_commit(tree, [], "my task\n", USER, 100)
    s.cas_ref(task_ref(tid), c, None)
    return c


def placer_over(nodes: list, ledger: TaskLedger) -> Placer:
    return Placer(lambda: nodes, lambda repo: ledger, lambda: "best-fit")


# -- the placer -----------------------------------------------------------------------------


def test_placer_follows_labels_over_the_nodes_it_is_given() -> None:
    led = TaskLedger(MemoryStore(), node="n1")
    submit(
        led, "t1", b'[placement]\nlabels = { gpu = "yes" }\n[[steps]]\nname = "a"\nrun = "true"\n'
    )
    nodes = [node_info("n1"), node_info("n2", labels={"gpu": "yes"})]
    from kovanex import spec as specmod

    spec = specmod.load_spec(led.spec_bytes("t1") or b"", specmod.SPEC_PATH)
    d = placer_over(nodes, led).decide("r", "t1", spec)
    assert d.node == "n2"
    assert "Score-Breakdown" in d.extra


def test_placer_skips_excluded_nodes_and_says_so_when_only_they_fit() -> None:
    led = TaskLedger(MemoryStore(), node="n1")
    submit(led, "t1", b'[[steps]]\nname = "a"\nrun = "true"\n')
    from kovanex import spec as specmod

    spec = specmod.load_spec(led.spec_bytes("t1") or b"", specmod.SPEC_PATH)
    req_nodes = [node_info("n1"), node_info("n2")]
    p = placer_over(req_nodes, led)
    d = p.decide_request(spec.request("r", "t1"), "best-fit", frozenset({"n1"}))
    assert d.node == "n2"
    d = p.decide_request(spec.request("r", "t1"), "best-fit", frozenset({"n1", "n2"}))
    assert d.node is None and "failed to start it (n1, n2)" in d.reason


# -- the scheduling shell and TaskRun on a real repo ---------------------------------------


class Node:
    """One node's scheduling services around a real bare repo, wired as the agent does."""

    def __init__(self, root: Path, slots: int = 1, others: list | None = None) -> None:
        layout = cfgmod.Layout(root)
        layout.repos.mkdir(parents=True)
        subprocess.run(
            ["git", "init", "-q", "--bare", str(layout.repo("r"))], check=True, capture_output=True
        )
        cfg = cfgmod.NodeConfig(name="n1", runner_slots=slots)
        self.clock = FakeClock()
        self.ctx = NodeContext(layout, cfg, token="t", clock=self.clock)
        self.repos = RepoIndex(layout, "n1")
        self.runs = RunTable(self.ctx)
        self.placer = Placer(
            lambda: [node_info("n1", runners_total=slots), *(others or [])],
            self.repos.ledger,
            lambda: "best-fit",
            clock=self.clock,
        )

        class NoServer:
            async def ask(self, key: tuple[str, str]) -> None:
                return None  # a FULL node places its own tasks: no SERVER in play

        self.sched = TaskScheduler(
            self.ctx, self.repos, self.runs, self.placer, NoServer(), TaskLocks()
        )  # type: ignore[arg-type]
        self.assigned: list[Assign] = []
        self.sched.announce = self.assigned.append
        self.runs.on_tip = self.sched.saw_tip
        self.done = asyncio.Event()
        self.runs.on_finished = lambda repo, task: self.done.set()
        self.led = self.repos.ledger("r")


def states(led: TaskLedger, tid: str) -> list[str]:
    return [tr.state for _, tr, _ in reversed(led.history(tid)) if tr is not None]


@pytest.fixture
def node(tmp_path: Path) -> Node:
    return Node(tmp_path / "n1")


def test_a_push_is_queued_placed_here_and_run_to_success(node: Node) -> None:
    submit(node.led, "t1")

    async def go() -> None:
        await node.sched.reconcile_task("r", "t1")  # a free slot: placed at once (ADR 0108)
        assert node.sched.pending == {}
        await node.sched.schedule_pending()
        await asyncio.wait_for(node.done.wait(), 20)

    asyncio.run(go())
    assert states(node.led, "t1") == [
        "queued",
        "placed",
        "running",
        "running",
        "running",
        "succeeded",
    ]
    assert node.led.read("t1").steps_ok == (0, 1)
    assert node.runs.slots.free == 1


def test_no_free_slot_keeps_the_task_queued_without_a_commit(tmp_path: Path) -> None:
    n = Node(tmp_path / "n1", slots=1)
    submit(n.led, "t1")

    async def go() -> None:
        assert n.runs.slots.try_acquire()  # someone else's run holds the only slot
        await n.sched.reconcile_task("r", "t1")
        assert states(n.led, "t1") == ["queued"]
        tip = n.led.tip("t1")
        await n.sched.schedule_pending()
        assert n.led.tip("t1") == tip
        assert ("r", "t1") in n.sched.pending

    asyncio.run(go())


def test_a_task_for_another_node_gets_an_assignment_not_a_local_run(tmp_path: Path) -> None:
    far = node_info("n2", labels={"gpu": "yes"})
    n = Node(tmp_path / "n1", slots=1, others=[far])
    submit(
        n.led, "t1", b'[placement]\nlabels = { gpu = "yes" }\n[[steps]]\nname = "a"\nrun = "true"\n'
    )

    async def go() -> None:
        await n.sched.reconcile_task("r", "t1")
        await n.sched.schedule_pending()

    asyncio.run(go())
    view = n.led.read("t1")
    assert (view.state, view.node) == ("placed", "n2")
    assert n.assigned == [Assign("r", "t1", "n2", view.epoch)]
    assert n.runs.runs == {}


def test_a_placement_refused_for_an_older_term_stays_queued_and_is_placed_at_the_newer(
    tmp_path: Path,
) -> None:
    """After a heal the owner's view of the lease can trail the branch: the leader requeued
    the task at term 5 while the owner still grants term 2. The store refuses that
    placement (StaleTerm) and the tip does not move, so the task must stay queued for the
    next pass; it was dropped from the queue for good before (found by the partition
    tests: a pinned task stayed `queued` after the heal)."""
    far = node_info("n2", labels={"gpu": "yes"})
    n = Node(tmp_path / "n1", slots=1, others=[far])
    submit(
        n.led, "t1", b'[placement]\nlabels = { gpu = "yes" }\n[[steps]]\nname = "a"\nrun = "true"\n'
    )
    led = n.led
    term = {"Term": "2"}
    n.sched.grant = lambda spec, repo: dict(term)

    async def go() -> None:
        await n.sched.reconcile_task("r", "t1")
        v = led.read("t1")  # the leader's reschedule at term 5, as the heal found it
        led.append("t1", taskcore.place(v, "n2", {"Term": "5"}), expected_tip=v.tip, lease_epoch=2)
        v = led.read("t1")
        led.append("t1", taskcore.requeue(v, "the leader re-places it"), expected_tip=v.tip,
                   lease_epoch=v.epoch)  # fmt: skip
        await n.sched.reconcile_task("r", "t1")
        tip = led.tip("t1")
        await n.sched.schedule_pending()
        assert led.tip("t1") == tip  # refused: nothing written
        assert ("r", "t1") in n.sched.pending
        term["Term"] = "5"  # the owner read the lease
        await n.sched.schedule_pending()

    asyncio.run(go())
    view = led.read("t1")
    assert (view.state, view.node) == ("placed", "n2")
    assert led.newest_term(view.tip) == 5


def test_a_restarted_owner_fences_its_own_old_lease_and_resumes_after_the_last_step(
    node: Node,
) -> None:
    """The lease says n1 runs it, but nothing runs here: an agent that was killed."""
    submit(node.led, "t1")
    led = node.led
    v = led.read("t1")
    led.append("t1", taskcore.queue(v, 50), expected_tip=v.tip, lease_epoch=v.epoch)
    lease = led.claim("t1", "n1")
    v = led.read("t1")
    led.append("t1", taskcore.start(v, "n1", lease.epoch), expected_tip=v.tip, lease_epoch=1)
    v = led.read("t1")
    (ok, *_) = taskcore.step_done(v, 0, "one", 2, "ok", 0, 0)
    tree = led.store.tree_with(led.store.read_commit(v.tip).tree, {"one.txt": b"one\n"})
    led.append("t1", ok, expected_tip=v.tip, lease_epoch=1, tree=tree)

    async def go() -> None:
        await node.sched.reconcile_task("r", "t1")
        view = led.read("t1")
        assert (view.state, view.epoch) == ("queued", 2)
        assert "restarted" in view.reason
        await node.sched.schedule_pending()
        await asyncio.wait_for(node.done.wait(), 20)

    asyncio.run(go())
    view = led.read("t1")
    assert view.state == "succeeded" and view.epoch == 3
    steps = [tr.step for _, tr, _ in led.history("t1") if tr is not None and tr.result == "ok"]
    assert sorted(steps) == [0, 1]  # step one ran once, before the restart; two after it


def test_unschedulable_is_written_once_and_the_task_stays_pending(node: Node) -> None:
    submit(
        node.led, "t1", b'[placement]\nrequires = ["gpu"]\n[[steps]]\nname = "a"\nrun = "true"\n'
    )

    async def go() -> None:
        await node.sched.reconcile_task("r", "t1")
        await node.sched.schedule_pending()
        first = node.led.tip("t1")
        await node.sched.schedule_pending()
        assert node.led.tip("t1") == first  # no commit per pass

    asyncio.run(go())
    view = node.led.read("t1")
    assert view.state == "unschedulable" and "gpu" in view.reason
    assert ("r", "t1") in node.sched.pending


def test_decision_type_is_the_cores() -> None:
    """One Decision for the placer, the server answer and the decider (not two copies)."""
    from kovanex.agent import placement, serverplace

    assert placement.Decision is Decision and serverplace.Decision is Decision


def test_the_watchers_echo_of_our_own_write_is_announced_not_reconciled(node: Node) -> None:
    """Issue 11: every commit we write comes back from the watcher. Our own tip needs only
    an announcement (no reconcile, no settle); anybody else's move is reconciled, settled."""
    from kovanex.agent.dispatch import Dispatcher

    submit(node.led, "t1")

    async def go() -> None:
        d = Dispatcher(node.repos, node.sched, replicas=None)
        await node.sched.reconcile_task("r", "t1")  # we write `queued`
        d.ref_moved("r", "t1")
        assert (d._dirty, d._announce, d._settle) == ({}, {"r"}, False)
        v = node.led.read("t1")  # someone else moves the branch (a cancel, a push)
        node.led.append("t1", taskcore.cancel(v, "by hand"), expected_tip=v.tip, lease_epoch=9)
        d.ref_moved("r", "t1")
        assert (d._dirty, d._settle) == ({"r": {"t1"}}, True)
        d2 = Dispatcher(node.repos, node.sched, replicas=None)
        d2.ran("r", "t1")  # a finished run frees a slot: place at once
        assert (d2._dirty, d2._settle) == ({"r": {"t1"}}, False)

    asyncio.run(go())


def test_an_excluded_runner_that_joins_again_gets_the_unschedulable_task_back(
    tmp_path: Path,
) -> None:
    """Issue 25 bugs 1 and 9, the user's story on a real repo: only n3 provides `sast`; it
    missed the placement deadline (it was restarting) and was excluded, so the task went
    unschedulable for good. Now n3 joining again lets it back in, audibly in git."""
    from kovanex.agent.failover import Failover
    from kovanex.core import startwatch

    n = Node(tmp_path / "n1", others=[node_info("n3", capabilities=frozenset({"sast"}))])
    spec = b'[placement]\nrequires = ["sast"]\n[[steps]]\nname = "a"\nrun = "true"\n'
    submit(n.led, "t1", spec)
    fo = Failover(n.ctx, n.repos, n.sched.locks, None)  # type: ignore[arg-type]
    fo.requeued = lambda repo, task: n.sched.after_write(repo, task)

    async def go() -> None:
        await n.sched.reconcile_task("r", "t1")
        await n.sched.schedule_pending()
        view = n.led.read("t1")
        assert (view.state, view.node) == ("placed", "n3")
        # n3 never starts it: the deadline's requeue excludes it (what PlacementDeadline writes)
        w = startwatch.watch(view, None, 0.0)
        tr = startwatch.decide(view, w, 10.0, 10.0, None, frozenset())
        assert tr is not None
        n.led.append("t1", tr, expected_tip=view.tip, lease_epoch=tr.epoch)
        n.sched.after_write("r", "t1")
        await n.sched.schedule_pending()
        assert n.led.read("t1").state == "unschedulable"
        await fo.let_back("n9")  # another node: nothing changes
        assert n.led.read("t1").state == "unschedulable"
        await fo.let_back("n3")
        await n.sched.schedule_pending()

    asyncio.run(go())
    view = n.led.read("t1")
    assert (view.state, view.node) == ("placed", "n3")
    assert states(n.led, "t1")[-4:] == ["queued", "unschedulable", "queued", "placed"]
    cleared = [tr for _, tr, _ in n.led.history("t1") if tr and "Excluded-Cleared" in tr.extra]
    assert [tr.extra["Excluded-Cleared"] for tr in cleared] == ["n3"]
    assert [a.node for a in n.assigned] == ["n3", "n3"]


def test_an_idle_matching_node_gets_an_excluded_task_back_when_its_exclusion_lapses(
    tmp_path: Path,
) -> None:
    """Issue 25 bug 9 (KOVANEX_SEED=16): n3, the one node with `sast`, missed the
    placement deadline without ever leaving the cluster (cut off for a moment, a loaded
    host), so no join lets it back in, and the task stayed unschedulable beside an idle n3.
    Its exclusion lapses after the placement deadline (10 s here), doubled per lapse."""
    from kovanex.core import startwatch

    n = Node(tmp_path / "n1", others=[node_info("n3", capabilities=frozenset({"sast"}))])
    spec = b'[placement]\nrequires = ["sast"]\n[[steps]]\nname = "a"\nrun = "true"\n'
    submit(n.led, "t1", spec)

    async def miss_the_deadline() -> None:
        view = n.led.read("t1")
        assert (view.state, view.node) == ("placed", "n3")
        tr = startwatch.decide(view, startwatch.watch(view, None, 0.0), 10.0, 10.0, None,
                               n.placer.excluded("r", "t1"))  # fmt: skip
        assert tr is not None
        n.led.append("t1", tr, expected_tip=view.tip, lease_epoch=tr.epoch)
        n.sched.after_write("r", "t1")
        await n.sched.schedule_pending()
        assert n.led.read("t1").state == "unschedulable"

    async def pass_at(seconds: float) -> str:
        n.clock.advance(seconds)
        await n.sched.schedule_pending()  # what the sweep runs every few seconds
        return n.led.read("t1").state

    async def go() -> None:
        await n.sched.reconcile_task("r", "t1")
        await n.sched.schedule_pending()
        await miss_the_deadline()
        assert await pass_at(9.0) == "unschedulable"  # the exclusion holds for a deadline
        assert await pass_at(1.0) == "placed"  # then lapses: n3 is idle and matches
        assert n.led.read("t1").node == "n3"
        await miss_the_deadline()  # it fails again: the next lapse waits twice as long
        assert await pass_at(19.0) == "unschedulable"
        assert await pass_at(1.0) == "placed"

    asyncio.run(go())
    cleared = [tr for _, tr, _ in n.led.history("t1") if tr and "Excluded-Cleared" in tr.extra]
    assert [tr.extra["Excluded-Cleared"] for tr in cleared] == ["n3", "n3"]
    assert [a.node for a in n.assigned] == ["n3", "n3", "n3"]


def test_the_placement_deadline_requeues_a_silent_runner_in_virtual_time(tmp_path: Path) -> None:
    """The seed profile's one-minute placement deadline, over the virtual loop: the
    `PlacementDeadline` guard sleeps on the node's clock, so the requeue that excludes the
    runner that never started comes after 60 s of virtual time and well under a second of
    wall time (before issue 25 part 2 this test waited the minute)."""
    from kovanex.agent.deadline import PlacementDeadline
    from kovanex.core.gossip_profiles import profile
    from kovanex.net.gossip import GossipNode
    from kovanex.net.transport import MemoryNetwork, MemoryTransport
    from kovanex.testing import run_virtual

    n = Node(tmp_path / "n1", others=[node_info("n3", capabilities=frozenset({"sast"}))])
    spec = b'[placement]\nrequires = ["sast"]\n[[steps]]\nname = "a"\nrun = "true"\n'
    submit(n.led, "t1", spec)
    seed = profile("seed")
    gossip = GossipNode(
        "n1", seed, None, {}, transport=MemoryTransport(MemoryNetwork()), clock=n.clock
    )
    guard = PlacementDeadline(n.ctx, n.repos, n.placer, n.sched.locks, gossip)
    n.sched.watch_lease = guard.watch
    guard.requeued = n.sched.after_write

    async def go() -> float:
        await gossip.start(("127.0.0.1", 0))
        guarding = asyncio.create_task(guard.guard())
        await n.sched.reconcile_task("r", "t1")
        await n.sched.schedule_pending()
        assert (n.led.read("t1").state, n.led.read("t1").node) == ("placed", "n3")
        t0 = n.clock.monotonic()
        while n.led.read("t1").state == "placed" and n.clock.monotonic() - t0 < 600:
            await n.clock.sleep(1.0)
        took = n.clock.monotonic() - t0
        guarding.cancel()
        await gossip.close()
        return took

    wall = time.monotonic()
    took = run_virtual(go(), n.clock, wall_limit_s=20.0)
    wall = time.monotonic() - wall
    assert seed.placement_deadline <= took <= seed.placement_deadline + 2.0
    assert n.led.read("t1").state in ("queued", "unschedulable")
    assert any("Excluded" in (tr.extra if tr else {}) for _, tr, _ in n.led.history("t1"))
    assert wall < 10.0, f"{wall:.2f}s of wall time for a 60 s deadline"


def test_a_member_that_joins_again_gets_our_inventory_afresh(tmp_path: Path) -> None:
    """Issue 25 bug 3 (KOVANEX_SEED=10): a node cut off while our inventory changed (we
    took a repo over) missed that broadcast; it listed the repo under its old owner until
    a push-pull. When it joins again, the inventory is published anew at the next pass,
    and, for a node nobody saw dead, at least every INVENTORY_REFRESH_S."""
    from kovanex.agent.cluster import Cluster
    from kovanex.agent.placement import LocalNode
    from kovanex.net.gossip import MemberInfo
    from kovanex.net.keyring import Keyring
    from kovanex.net.transport import MemoryNetwork, MemoryTransport
    from kovanex.testing import run_virtual

    n = Node(tmp_path / "n1")
    local = LocalNode(n.ctx, n.runs, n.repos, lambda: 1.0)
    cl = Cluster(
        n.ctx, local, lambda: "http://127.0.0.1:1", lambda topic, m: None,
        keyring=Keyring(), transport=MemoryTransport(MemoryNetwork(), clock=n.clock),
    )  # fmt: skip

    cl.inventory_refresh_s = 60.0  # the join alone, first

    def version() -> int:
        e = cl.node.core.app.get(("repos", "n1"))
        return 0 if e is None else e.version

    async def go() -> list[int]:
        await cl.node.start(("127.0.0.1", 0))
        fresh = asyncio.create_task(cl.keep_fresh(lambda: (["r"], []), lambda: None))
        seen = []
        await n.clock.sleep(2.5)
        seen.append(version())  # published once: unchanged since
        await n.clock.sleep(2.0)
        seen.append(version())
        back = MemberInfo("n2", ("127.0.0.1", 9), "alive", 2, {})
        cl._on_member_event("member-join", back)
        await n.clock.sleep(1.5)
        seen.append(version())
        cl._on_member_event("member-update", back)  # a mere update: nothing missed
        await n.clock.sleep(1.5)
        seen.append(version())
        cl.inventory_refresh_s = 2.0  # the default: at least every 2 s, whoever missed it
        await n.clock.sleep(2.5)
        seen.append(version())
        fresh.cancel()
        await cl.node.close()
        return seen

    first, unchanged, after_join, after_update, refreshed = run_virtual(
        go(), n.clock, wall_limit_s=20.0
    )
    assert first > 0 and unchanged == first
    assert after_join > first  # a fresh version: a broadcast that reaches the joiner
    assert after_update == after_join
    assert refreshed > after_update
