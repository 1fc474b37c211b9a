"""The placement deadline and per-task exclusions as a pure decider, on a fake clock."""

from __future__ import annotations

import pytest

from kovanex.core import placing, scoring
from kovanex.core import startwatch as sw
from kovanex.core import task as taskcore
from kovanex.core.scoring import NodeInfo
from kovanex.testing import node_info

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
    assert "n3" in msg and "`kovanex task retry` lets them try again, or add a node" in msg


# -- issue 25 bugs 1 and 9: nothing revived an excluded task ---------------------------------
def _excluded_then_unschedulable() -> tuple[taskcore.TaskView, list[taskcore.Transition | None]]:
    """The user's story: `requires = ["sast"]`, only n3 provides it; n3 restarted and missed
    the placement deadline, so it was excluded and the task went unschedulable."""
    view = placed("n3", 4)
    w = sw.watch(view, None, 100.0)
    requeue = sw.decide(view, w, 110.0, DEADLINE, None, frozenset())
    assert requeue is not None and requeue.extra["Excluded"] == "n3"
    queued = taskcore.apply(view, "c2", requeue)
    unsched = taskcore.mark_unschedulable(queued, "every node that could run this task failed")
    history = [unsched, requeue, taskcore.Transition(taskcore.PLACED, 4, node="n3")]
    return taskcore.apply(queued, "c3", unsched), history


def _sast_on_n3(excl: frozenset[str]) -> placing.Decision:
    nodes = [node_info("n1"), node_info("n3", capabilities=frozenset({"sast"}))]
    req = scoring.TaskRequest("t1", "demo", requires=frozenset({"sast"}))
    return placing.decide(nodes, req, "best-fit", excl)


def test_retry_revives_an_unschedulable_task_and_clears_its_exclusions() -> None:
    view, history = _excluded_then_unschedulable()
    excl = sw.excluded(history)
    assert view.state == taskcore.UNSCHEDULABLE and excl == {"n3"}
    assert _sast_on_n3(excl).node is None  # n3 is idle again, but excluded
    tr = sw.retried(view, excl)
    assert (tr.state, tr.epoch) == (taskcore.QUEUED, view.epoch)
    trailers = dict(tr.to_trailers())
    assert trailers["Kovanex-Excluded-Cleared"] == "n3"  # auditable: who was let back in
    back = taskcore.Transition.from_trailers(trailers)  # as the ledger reads it back
    assert sw.excluded([back, *history]) == frozenset()
    assert _sast_on_n3(sw.excluded([back, *history])).node == "n3"
    # a later miss excludes afresh from there, not on top of the cleared set
    again = sw.decide(placed("n3", 6), sw.Watch("n3", 6, 0.0), 10.0, DEADLINE, None,
                      sw.excluded([back, *history]))  # fmt: skip
    assert again is not None and again.extra["Excluded"] == "n3"


def test_schedule_and_reschedule_revive_held_and_unschedulable_tasks() -> None:
    view, history = _excluded_then_unschedulable()
    tr = sw.revive(view, sw.excluded(history), "scheduled via API")
    assert tr.state == taskcore.QUEUED and tr.extra["Excluded-Cleared"] == "n3"
    held = placed("n2", 7)
    tr = sw.revive(held, frozenset({"n3"}), "rescheduled via API")
    assert (tr.state, tr.epoch, tr.reason) == (taskcore.QUEUED, 8, "rescheduled via API")
    assert tr.extra["Excluded-Cleared"] == "n3"
    assert "Excluded-Cleared" not in sw.revive(held, frozenset(), "r").extra  # nothing to clear
    with pytest.raises(taskcore.IllegalTransition) as e:
        sw.revive(taskcore.TaskView("t1", taskcore.SUCCEEDED, 3), frozenset(), "r")
    assert "retry applies to unschedulable, failed, cancelled tasks" in str(e.value)


def test_the_retry_refusal_names_states_not_events() -> None:
    """It said "cannot retry from state 'unschedulable' (allowed: place, unschedulable,
    cancel)": a list of events that read as states, and contradicted itself."""
    with pytest.raises(taskcore.IllegalTransition) as e:
        taskcore.retry(taskcore.TaskView("t1", taskcore.RUNNING, 3, node="n1"))
    assert str(e.value) == (
        "task t1: cannot retry a running task (retry applies to unschedulable, failed, "
        "cancelled tasks; a running task allows: step, reattempt, succeed, fail, requeue, cancel)"
    )


def test_a_node_that_joins_again_is_let_back_in() -> None:
    view, history = _excluded_then_unschedulable()
    both = sw.excluded(history) | {"n4"}
    tr = sw.rejoined(view, both, "n3")
    assert tr is not None and tr.state == taskcore.QUEUED
    assert (tr.extra["Excluded-Cleared"], tr.extra["Excluded"]) == ("n3", "n4")
    assert tr.reason == "node n3 joined again; its exclusion is cleared"
    assert sw.excluded([tr, *history]) == {"n4"}
    assert sw.rejoined(view, both, "n9") is None  # not excluded: nothing to do
    assert sw.rejoined(placed("n2", 7), both, "n3") is None  # only unschedulable tasks


def test_exclusions_lapse_after_a_backoff_only_while_an_idle_matching_node_is_held_back() -> None:
    """Issue 25 bug 9: a task kept from an idle matching node by its exclusions alone is
    let back in after the placement deadline, doubled per lapse, at most LAPSE_MAX_S."""
    n3 = frozenset({"n3"})
    mem, let = sw.lapse(None, n3, 100.0, DEADLINE)
    assert (mem, let) == (sw.Lapse(100.0, 0), frozenset())
    mem, let = sw.lapse(mem, n3, 109.9, DEADLINE)
    assert let == frozenset()
    mem, let = sw.lapse(mem, n3, 110.0, DEADLINE)
    assert (mem, let) == (sw.Lapse(None, 1), n3)
    # n3 failed again: the clock restarts and waits twice as long
    mem, let = sw.lapse(mem, n3, 200.0, DEADLINE)
    assert sw.lapse(mem, n3, 219.9, DEADLINE)[1] == frozenset()
    assert sw.lapse(mem, n3, 220.0, DEADLINE)[1] == n3
    # nothing held back (n3 busy, gone, or placed): the clock stops, the tries are kept
    assert sw.lapse(mem, frozenset(), 230.0, DEADLINE) == (sw.Lapse(None, 1), frozenset())
    assert sw.lapse(None, frozenset(), 230.0, DEADLINE) == (None, frozenset())
    assert sw.lapse_after(30, DEADLINE) == sw.LAPSE_MAX_S
    extra = sw.lapsed_extra({"Score": "1"}, n3, frozenset({"n3", "n4"}))
    assert extra == {"Score": "1", "Excluded-Cleared": "n3", "Excluded": "n4"}


def test_held_back_names_only_excluded_nodes_that_would_take_the_task_now() -> None:
    req = scoring.TaskRequest(repo="r", task_id="t1", requires=frozenset({"sast"}))
    sast = frozenset({"sast"})
    idle = node_info("n3", capabilities=sast)
    busy = node_info("n4", capabilities=sast, runners_total=1, runners_used=1)
    plain = node_info("n5")
    cordoned = node_info("n6", capabilities=sast, cordoned=True)
    nodes = [idle, busy, plain, cordoned]
    every = frozenset({"n3", "n4", "n5", "n6"})
    assert placing.held_back(nodes, req, "best-fit", every) == {"n3"}
    assert placing.held_back(nodes, req, "best-fit", frozenset({"n4"})) == frozenset()
