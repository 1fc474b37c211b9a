"""The reconciliation decider in process (ADR 0028): which commit, which state, which tree."""

from __future__ import annotations

import itertools

import pytest

from kovanex.core import reconcile as rc
from kovanex.core import task as core
from kovanex.core.task import TaskView

REF = "refs/heads/task/t1"


def view(state: str, epoch: int, attempt: int = 0) -> TaskView:
    return TaskView("t1", state, epoch, attempt=attempt, tip="x")


def side(node: str, tip: str, v: TaskView | None, tree: str = "T0", **kw: str) -> rc.Side:
    return rc.Side(node, 2 if node == "n2" else 1, tip, tree, v, **kw)


@pytest.mark.parametrize(
    ("a", "b", "want"),
    [
        ("succeeded", "running", "succeeded"),
        ("failed", "succeeded", "succeeded"),
        ("cancelled", "running", "cancelled"),
        ("succeeded", "cancelled", "succeeded"),
        ("failed", "failed", "failed"),
        ("failed", "running", "queued"),
        ("running", "placed", "queued"),
        ("queued", "submitted", "queued"),
    ],
)
def test_merged_state_precedence_is_symmetric(a: str, b: str, want: str) -> None:
    for x, y in ((a, b), (b, a)):
        state, epoch = rc.merged_state(view(x, 3), view(y, 5))
        assert state == want
        # a live outcome is requeued above both sides' epochs (both may have granted 4)
        assert epoch == (6 if want == core.QUEUED else 5)


def test_every_pair_of_states_gives_a_state_the_ledger_knows() -> None:
    states = [core.SUBMITTED, *core.STATES]
    for a, b in itertools.product(states, states):
        state, _ = rc.merged_state(view(a, 1), view(b, 1))
        assert state in core.STATES


def test_diverged_task_branch_gets_a_two_parent_merge_with_the_trailer() -> None:
    ours = side("n2", "o" * 40, view(core.RUNNING, 2, attempt=1), tree="T-ours")
    theirs = side("n1", "t" * 40, view(core.RUNNING, 2), tree="T0")
    m = rc.reconcile(REF, ours, theirs, contained=False, base_tree="T0")
    assert m is not None
    assert m.parents == ("o" * 40, "t" * 40)  # survivor first: the fold follows its line
    assert m.tree == "T-ours"  # only our side changed the tree
    assert m.transition is not None
    assert (m.transition.state, m.transition.epoch, m.transition.attempt) == ("queued", 3, 1)
    trailers = dict(m.transition.to_trailers())
    assert trailers["Kovanex-Reconciled"] == f"ours=n2@2:{'o' * 40} theirs=n1@1:{'t' * 40}"
    # the commit folds back into the state the decider chose
    assert core.fold("t1", [("m", core.Transition.from_trailers(trailers))]).state == "queued"


def test_tree_follows_the_side_that_changed_it() -> None:
    assert rc.choose_tree("T0", "T-theirs", "T0") == "T-theirs"
    assert rc.choose_tree("T-ours", "T-theirs", "T0") == "T-ours"  # both: the survivor's
    assert rc.choose_tree(None, "T-theirs", None) == "T-theirs"


def test_nothing_to_do_when_contained_or_absolute_consistency() -> None:
    ours = side("n2", "o" * 40, view(core.RUNNING, 2))
    theirs = side("n1", "t" * 40, view(core.RUNNING, 2))
    assert rc.reconcile(REF, ours, theirs, contained=True, base_tree=None) is None
    ac = side("n1", "t" * 40, view(core.RUNNING, 2), failover=rc.ABSOLUTE_CONSISTENCY)
    assert rc.reconcile(REF, ours, ac, contained=False, base_tree="T0") is None


def test_a_consistent_branch_only_the_deposed_side_had_is_adopted_its_lease_fenced() -> None:
    """A task pushed to the minority (an acknowledged push) keeps its branch after the
    heal: as is, or requeued at a new epoch when the deposed side holds a lease on it; a
    consistent branch both sides have is still never merged."""
    ac = rc.ABSOLUTE_CONSISTENCY
    for state in (core.QUEUED, core.SUCCEEDED):
        theirs = side("n1", "t" * 40, view(state, 3), tree="T7", failover=ac)
        m = rc.reconcile(REF, None, theirs, contained=False, base_tree=None)
        assert m is not None and rc.adopt_only(m) and m.parents == ("t" * 40,) and m.tree == "T7"
    leased = side("n1", "t" * 40, view(core.RUNNING, 3), failover=ac)
    m = rc.reconcile(REF, None, leased, contained=False, base_tree=None)
    assert m is not None and m.parents == ("t" * 40,) and m.transition is not None
    assert (m.transition.state, m.transition.epoch) == ("queued", 4)
    ours = side("n2", "o" * 40, view(core.QUEUED, 2), failover=ac)
    theirs = side("n1", "t" * 40, view(core.QUEUED, 3), failover=ac)
    assert rc.reconcile(REF, ours, theirs, contained=False, base_tree="T0") is None


def test_branch_only_the_deposed_side_had_is_adopted_or_its_lease_fenced() -> None:
    queued = side("n1", "t" * 40, view(core.QUEUED, 1))
    m = rc.reconcile(REF, None, queued, contained=False, base_tree=None)
    assert m is not None and rc.adopt_only(m) and m.parents == ("t" * 40,)
    running = side("n1", "t" * 40, view(core.RUNNING, 4), tree="T9")
    m = rc.reconcile(REF, None, running, contained=False, base_tree=None)
    assert m is not None and not rc.adopt_only(m)
    assert m.parents == ("t" * 40,) and m.tree == "T9"
    assert m.transition is not None and (m.transition.state, m.transition.epoch) == ("queued", 5)
    assert "ours=none" in m.transition.extra[rc.TRAILER]


def test_plain_branch_merges_with_only_the_trailer() -> None:
    ours = side("n2", "o" * 40, None, tree="T1")
    theirs = side("n1", "t" * 40, None, tree="T2")
    m = rc.reconcile("refs/heads/main", ours, theirs, contained=False, base_tree="T0")
    assert m is not None and m.transition is None and m.tree == "T1"
    assert m.trailers == (("Kovanex-Reconciled", rc.describe(ours, theirs)),)
