"""Remote-run redelivery and hand-back as a pure core (agent/remoterun.py runs it): what
starts, what waits for the run here, when a crashed run is delivered again and when its
lease goes back to the owner, and when a run stands down."""

from __future__ import annotations

from typing import Any

from kovanex.core import remoterun as rr
from kovanex.core.decider import Driver
from kovanex.testing import FakeClock, task_view

KEY = ("r", "t1")


def assign(node: str = "n1", epoch: int = 3) -> dict[str, Any]:
    return {"repo": "r", "task": "t1", "node": node, "epoch": epoch, "url": "http://o:1",
            "owner": "n2"}  # fmt: skip


def lease(state: str, node: str = "n1", epoch: int = 3) -> rr.OwnerLease:
    return rr.owner_lease(task_view("t1", state, node=node, epoch=epoch))


def driver(**kw: Any) -> Driver[rr.RemoteRunState, rr.Event, rr.Effect]:
    return Driver(rr.decide, rr.RemoteRunState("n1", **kw))


def test_an_assignment_to_us_is_started_after_learning_the_owner() -> None:
    out = driver().step(rr.AssignSeen(KEY, assign()), 0.0)
    assert out == [rr.LearnOwner("r", "http://o:1"), rr.Start(assign())]


def test_an_assignment_to_another_node_or_malformed_is_ignored() -> None:
    d = driver()
    assert d.step(rr.AssignSeen(KEY, assign(node="n2")), 0.0) == []
    assert d.step(rr.AssignSeen(KEY, {"repo": "r"}), 0.0) == []
    assert d.step(rr.AssignSeen(KEY, None), 0.0) == []


def test_a_retracted_or_moved_assignment_of_a_watched_run_is_verified() -> None:
    d = driver()
    assert d.step(rr.AssignSeen(KEY, None, watched_epoch=3, running_epoch=3), 0.0) == [
        rr.Verify(KEY)
    ]
    assert d.step(rr.AssignSeen(KEY, assign("n2", 4), watched_epoch=3), 0.0) == [rr.Verify(KEY)]
    # our own lease echoed: nothing to verify, nothing new to start
    echo = d.step(rr.AssignSeen(KEY, assign(), watched_epoch=3, running_epoch=3), 0.0)
    assert echo == [rr.LearnOwner("r", "http://o:1"), rr.Busy(KEY, 3)]


def test_a_newer_lease_waits_for_the_run_here_then_starts() -> None:
    d = driver()
    out = d.step(rr.AssignSeen(KEY, assign(epoch=5), running_epoch=3), 0.0)
    assert out[-1] == rr.Supersede(KEY, 5)
    assert d.state.pending == {KEY: assign(epoch=5)}
    assert d.step(rr.SupersedeRead(KEY, 5, lease("placed", epoch=5)), 0.1) == [
        rr.StandDown(KEY, "lease moved on the owner: placed n1@5")
    ]
    assert d.step(rr.RunEnded(KEY), 0.2) == [rr.Start(assign(epoch=5))]
    assert d.state.pending == {}


def test_a_superseding_lease_the_owner_does_not_confirm_leaves_the_run() -> None:
    d = driver()
    d.step(rr.AssignSeen(KEY, assign(epoch=5), running_epoch=3), 0.0)
    assert d.step(rr.SupersedeRead(KEY, 5, lease("placed", "n2", 6)), 0.1) == []


def test_a_crashed_run_is_delivered_again_then_handed_back() -> None:
    clock = FakeClock()
    d = driver(redeliver_s=2.0, redeliver_max=3)
    for n in range(3):
        out = d.step(rr.RunEnded(KEY, crashed_epoch=3 + n), clock.monotonic())
        assert out == [rr.RedeliverAt(KEY, clock.monotonic() + 2.0)]
        clock.advance(2.0)
        assert d.step(rr.RedeliverDue(KEY, assign(), running=False), clock.monotonic()) == [
            rr.Start(assign(), again=True)
        ]
    assert d.step(rr.RunEnded(KEY, crashed_epoch=6), clock.monotonic()) == [
        rr.HandBack(KEY, 6, "its runs on n1 crashed 3 times")
    ]


def test_a_redelivery_finds_the_assignment_gone_or_the_task_running() -> None:
    d = driver()
    assert d.step(rr.RedeliverDue(KEY, None, running=False), 0.0) == []
    assert d.step(rr.RedeliverDue(KEY, assign("n2"), running=False), 0.0) == []
    assert d.step(rr.RedeliverDue(KEY, assign(), running=True), 0.0) == []


def test_a_run_that_ends_cleanly_is_not_delivered_again() -> None:
    assert driver().step(rr.RunEnded(KEY), 0.0) == []


def test_the_owners_branch_decides_a_start() -> None:
    d = driver()
    assert d.step(rr.StartRead(KEY, 3, lease("placed")), 0.0) == [rr.RunHere(KEY, 3)]
    assert d.step(rr.StartRead(KEY, 3, lease("running")), 0.0) == [
        rr.Requeue(KEY, "agent n1 restarted; rescheduling")
    ]
    stale = lease("placed", "n2", 4)
    assert d.step(rr.StartRead(KEY, 3, stale), 0.0) == [rr.Stale(KEY, 3, stale)]
    assert d.step(rr.StartRead(KEY, 3, lease("succeeded")), 0.0) == []


def test_a_watched_run_stands_down_only_when_its_lease_moved() -> None:
    d = driver()
    assert d.step(rr.VerifyRead(KEY, 3, lease("running")), 0.0) == []
    for moved in (lease("running", epoch=4), lease("running", "n2"), lease("cancelled")):
        assert d.step(rr.VerifyRead(KEY, 3, moved), 0.0) == [rr.StandDown(KEY, rr.moved(moved))]


def test_a_hand_back_requeues_only_our_lease_with_no_run_here() -> None:
    d = driver()
    why = "r moved to n2"
    assert d.step(rr.HandBackRead(KEY, 3, why, lease("running"), running=False), 0.0) == [
        rr.Requeue(KEY, why)
    ]
    assert d.step(rr.HandBackRead(KEY, 3, why, lease("running"), running=True), 0.0) == []
    assert d.step(rr.HandBackRead(KEY, 3, why, lease("running", epoch=4), False), 0.0) == []
    assert d.step(rr.HandBackRead(KEY, 3, why, lease("queued"), running=False), 0.0) == []
