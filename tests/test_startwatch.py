"""The placement deadline and per-task exclusions as a pure decider, on a fake clock."""

from __future__ import annotations

from kovanex.core import startwatch as sw
from kovanex.core import task as taskcore
from kovanex.core.scoring import NodeInfo

DEADLINE = 10.0


def placed(node: str = "n3", epoch: int = 4) -> taskcore.TaskView:
    return taskcore.TaskView("t1", taskcore.PLACED, epoch, node=node, tip="abc")


def test_silent_runner_is_requeued_at_the_deadline_under_a_new_epoch() -> None:
    view = placed()
    w = sw.watch(view, None, now=100.0)
    assert w == sw.Watch("n3", 4, 100.0)
    assert sw.decide(view, w, 109.9, DEADLINE, None, frozenset()) is None
    tr = sw.decide(view, w, 110.0, DEADLINE, None, frozenset())
    assert tr is not None
    assert (tr.state, tr.epoch) == (taskcore.QUEUED, 5)
    assert tr.reason == "runner n3 did not start the task within 10s"
    assert dict(tr.to_trailers())["Kovanex-Excluded"] == "n3"
    assert sw.due_at(w, DEADLINE) == 110.0


def test_the_clock_keeps_running_for_the_same_lease_and_restarts_for_a_new_one() -> None:
    w = sw.watch(placed(), None, 100.0)
    assert sw.watch(placed(), w, 105.0) is w  # seen again: the deadline does not move
    again = sw.watch(placed("n2", 5), w, 107.0)
    assert again == sw.Watch("n2", 5, 107.0)
    running = taskcore.TaskView("t1", taskcore.RUNNING, 5, node="n2")
    assert sw.watch(running, again, 108.0) is None
    # an old watch never fires against a newer lease
    assert sw.decide(placed("n2", 5), w, 999.0, DEADLINE, None, frozenset()) is None


def test_a_reported_failure_requeues_at_once_and_names_the_cause() -> None:
    view = placed()
    w = sw.watch(view, None, 100.0)
    fail = sw.StartFailure("n3", 4, "could not fetch: 401")
    tr = sw.decide(view, w, 100.1, DEADLINE, fail, frozenset({"n5"}))
    assert tr is not None and tr.reason == "runner n3 could not fetch: 401"
    assert tr.extra["Excluded"] == "n3,n5"  # cumulative: the newest requeue carries all


def test_a_stale_or_capacity_report_does_not_exclude_wrongly() -> None:
    view = placed()
    w = sw.watch(view, None, 100.0)
    old = sw.StartFailure("n3", 3, "could not fetch: 401")  # an earlier lease
    assert sw.decide(view, w, 101.0, DEADLINE, old, frozenset()) is None
    busy = sw.StartFailure("n3", 4, "had no free runner slot", exclude=False)
    tr = sw.decide(view, w, 101.0, DEADLINE, busy, frozenset())
    assert tr is not None and tr.state == taskcore.QUEUED and "Excluded" not in tr.extra


def test_only_placed_leases_are_watched_or_requeued() -> None:
    for state in (taskcore.QUEUED, taskcore.RUNNING, taskcore.SUCCEEDED):
        view = taskcore.TaskView("t1", state, 4, node="n3")
        assert sw.watch(view, None, 0.0) is None
        assert sw.decide(view, sw.Watch("n3", 4, 0.0), 1e9, DEADLINE, None, frozenset()) is None


def test_exclusions_come_from_the_current_generation_only() -> None:
    requeue = taskcore.Transition(taskcore.QUEUED, 5, extra={"Excluded": "n3,n4"})
    place = taskcore.Transition(taskcore.PLACED, 6, node="n2")
    older = taskcore.Transition(taskcore.QUEUED, 2, extra={"Excluded": "n9"})
    assert sw.excluded([place, requeue, older]) == {"n3", "n4"}
    assert sw.excluded([place, None, requeue]) == frozenset()  # a new push starts afresh
    # round trip through real trailers, as the ledger reads them back
    parsed = taskcore.Transition.from_trailers(dict(requeue.to_trailers()))
    assert parsed is not None and sw.excluded([parsed]) == {"n3", "n4"}


def test_candidates_drop_excluded_nodes() -> None:
    nodes = [NodeInfo(name=n, role="RUNNER") for n in ("n1", "n2", "n3")]
    assert [n.name for n in sw.candidates(nodes, frozenset({"n3"}))] == ["n1", "n2"]
    msg = sw.all_excluded_reason(frozenset({"n3"}), "no node has a free runner slot")
    assert "n3" in msg and "push again or add a node" in msg
