"""The scheduler decider, in process: placement, requeue and stand-down rules in
milliseconds, with no repo and no agent."""

from __future__ import annotations

from kovanex.core import task as taskcore
from kovanex.core.effects import (
    Assign,
    KillOrphan,
    QueueSubmission,
    StandDown,
    StartRun,
    WriteRef,
)
from kovanex.core.scheduler import (
    Decision,
    Scheduler,
    failed_holders,
    priority_of,
    requeue_held_by,
)
from kovanex.testing import task_view


def prio(n: int = 50):
    return lambda: n


def test_a_push_is_queued_and_then_waits_for_placement() -> None:
    s = Scheduler("n1")
    assert s.observe("r", task_view(state="submitted"), run_epoch=None, priority=prio()) == [
        QueueSubmission("r", "t1")
    ]
    assert s.observe("r", task_view(state="queued"), run_epoch=None, priority=prio(70)) == []
    assert s.pending == {("r", "t1"): ("c1", 70)}


def test_a_skipped_push_is_not_queued() -> None:
    s = Scheduler("n1")
    effects = s.observe(
        "r", task_view(state="submitted"), run_epoch=None, priority=prio(), skipped=True
    )
    assert effects == []
    assert s.pending == {}


def test_priority_is_read_once_per_tip() -> None:
    s = Scheduler("n1")
    asked = []

    def p() -> int:
        asked.append(1)
        return 50

    for _ in range(3):
        s.observe("r", task_view(), run_epoch=None, priority=p)
    assert len(asked) == 1
    s.observe("r", task_view(tip="c2"), run_epoch=None, priority=p)
    assert len(asked) == 2


def test_order_is_highest_priority_first() -> None:
    s = Scheduler("n1")
    s.observe("r", task_view("low"), run_epoch=None, priority=prio(10))
    s.observe("r", task_view("high"), run_epoch=None, priority=prio(90))
    s.observe("r", task_view("mid"), run_epoch=None, priority=prio(50))
    assert s.order() == [("r", "high"), ("r", "mid"), ("r", "low")]


def test_placing_here_writes_a_new_lease_then_starts_it() -> None:
    s = Scheduler("n1")
    v = task_view(epoch=3)
    s.observe("r", v, run_epoch=None, priority=prio())
    effects = s.decide("r", v, Decision(node="n1", extra={"Score": "0.9"}), slot_free=True)
    write, start = effects
    assert isinstance(write, WriteRef) and write.expected_tip == "c1"
    assert (write.transition.state, write.transition.epoch, write.transition.node) == (
        taskcore.PLACED,
        4,
        "n1",
    )
    assert write.transition.extra["Score"] == "0.9"
    # `running` rides on the same CAS as its own commit: same lease, same node and epoch
    (running,) = write.then
    assert (running.state, running.epoch, running.node) == (taskcore.RUNNING, 4, "n1")
    assert start == StartRun("r", "t1", 4)
    assert s.pending == {}


def test_placing_elsewhere_announces_the_assignment() -> None:
    s = Scheduler("n1")
    effects = s.decide("r", task_view(epoch=1), Decision(node="n2"), slot_free=False)
    assert effects[1] == Assign("r", "t1", "n2", 2)
    # the remote runner writes its own `running` when it starts, not the owner
    assert isinstance(effects[0], WriteRef) and effects[0].then == ()


def test_no_free_slot_here_waits_without_writing() -> None:
    s = Scheduler("n1")
    s.observe("r", task_view(), run_epoch=None, priority=prio())
    assert s.decide("r", task_view(), Decision(node="n1"), slot_free=False) == []
    assert ("r", "t1") in s.pending


def test_waiting_for_capacity_writes_nothing() -> None:
    s = Scheduler("n1")
    assert s.decide("r", task_view(), Decision(reason="busy", waiting=True), slot_free=True) == []


def test_unschedulable_is_written_once_per_reason() -> None:
    s = Scheduler("n1")
    d = Decision(reason="no node has label  gpu=yes")
    (w,) = s.decide("r", task_view(), d, slot_free=True)
    assert isinstance(w, WriteRef) and w.transition.state == taskcore.UNSCHEDULABLE
    said = task_view(state="unschedulable", reason="no node has label gpu=yes", tip="c2")
    assert s.decide("r", said, d, slot_free=True) == []
    other = Decision(reason="no node has capability x")
    assert len(s.decide("r", said, other, slot_free=True)) == 1


def test_a_task_that_moved_on_leaves_the_queue() -> None:
    s = Scheduler("n1")
    s.observe("r", task_view(), run_epoch=None, priority=prio())
    placed = task_view(state="placed", node="n2", epoch=1, tip="c2")
    assert s.decide("r", placed, Decision(node="n1"), slot_free=True) == []
    assert s.pending == {}


def test_our_lease_with_no_run_is_fenced_and_requeued() -> None:
    """We restarted: the old lease is fenced with a new epoch; its orphan step is killed."""
    s = Scheduler("n1")
    v = task_view(state="running", node="n1", epoch=5, tip="c9")
    kill, write = s.observe("r", v, run_epoch=None, priority=prio())
    assert kill == KillOrphan("r", "t1")
    assert isinstance(write, WriteRef)
    assert (write.transition.state, write.transition.epoch) == (taskcore.QUEUED, 6)
    assert write.expected_tip == "c9"


def test_our_current_run_is_left_alone() -> None:
    s = Scheduler("n1")
    v = task_view(state="running", node="n1", epoch=5)
    assert s.observe("r", v, run_epoch=5, priority=prio()) == []


def test_a_run_whose_lease_moved_stands_down() -> None:
    s = Scheduler("n1")
    for v in (
        task_view(state="running", node="n1", epoch=6),  # re-placed here under a new epoch
        task_view(state="placed", node="n2", epoch=6),  # re-placed elsewhere
        task_view(state="cancelled", node="n1", epoch=6),  # cancelled
    ):
        effects = s.observe("r", v, run_epoch=5, priority=prio())
        assert isinstance(effects[0], StandDown), v


def test_a_failed_holder_loses_its_leases_and_no_one_else_does() -> None:
    held = task_view(state="running", node="n2", epoch=2)
    (w,) = requeue_held_by("r", held, "n2")
    assert isinstance(w, WriteRef) and w.transition.epoch == 3
    assert "n2 failed" in w.transition.reason
    assert requeue_held_by("r", held, "n3") == []
    assert requeue_held_by("r", task_view(state="succeeded", node="n2"), "n2") == []


def test_failed_holders_are_found_from_membership() -> None:
    views = [
        task_view("a", "running", node="n2"),
        task_view("b", "placed", node="n3"),
        task_view("c", "succeeded", node="n4"),
        task_view("d", "running", node="n1"),
    ]
    status = {"n2": "dead", "n3": "alive", "n4": "dead", "n1": "dead"}
    assert failed_holders(views, status, me="n1") == ["n2"]


def test_priority_of_reads_the_newest_priority_trailer() -> None:
    q = taskcore.Transition(state="queued", epoch=0, extra={"Priority": "80"})
    p = taskcore.Transition(state="placed", epoch=1, node="n1")
    assert priority_of([p, q]) == 80
    assert priority_of([None]) == 50
    bad = taskcore.Transition(state="queued", epoch=0, extra={"Priority": "x"})
    assert priority_of([bad]) == 50
