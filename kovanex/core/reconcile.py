"""Reconciling a branch that diverged during a partition: a pure decider (ADR 0028).

Why: under `split_brain_allowed` (the default, and what async repos on the gossip backend
do) both sides of a partition accept pushes and run tasks. When it heals, the deposed
owner's diverged tips used to end only under `refs/kovanex/lost/`: acknowledged commits
vanished from the branch. Instead the surviving owner writes ONE merge commit per diverged
branch, first parent its own tip (so the ledger's first-parent fold stays its line), second
parent the other side's tip (so both histories stay reachable), with a `Kovanex-Reconciled`
trailer naming both sides and tips. This module decides that commit; the shell
(`kovanex.agent.replication.reconciler`) reads the inputs and writes it by compare-and-swap.

The merged task state, from the two sides' folded views (precedence, first match wins):
1. either side `succeeded`  -> succeeded (the work was done; running it again is waste);
2. either side `cancelled`  -> cancelled (a user asked it to stop, on whichever side);
3. both sides `failed`      -> failed;
4. otherwise                -> queued, at max(epochs) + 1: a lease granted on either side is
   fenced (the two sides may have granted the same epoch to different nodes), and the task
   is placed again by the surviving owner; steps the surviving side finished stay done.
A side absent (a branch created during the partition) is adopted as is unless it holds a
lease (placed/running on the deposed side): then it is requeued the same way.
The tree: a 3-way choice against the merge base's tree: the side that changed it wins; if
both changed it, the survivor's (the other tree stays reachable through the second parent).
Branches whose task asks for `absolute_consistency` are never merged (its minority halts
and writes nothing acknowledged), but one only the deposed side has (pushed to the
minority: an acknowledged push) is adopted like any other, its lease there fenced; not
adopting it lost the push (tests/test_partition_nats.py found it). Other refs under
refs/heads/ merge with the tree rule and no task state.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kovanex.core import task as core
from kovanex.core.task import TaskView, Transition

TRAILER = "Reconciled"  # written as Kovanex-Reconciled (a Transition extra)
SPLIT_BRAIN_ALLOWED = "split_brain_allowed"
ABSOLUTE_CONSISTENCY = "absolute_consistency"
LIVE_LEASE = frozenset({core.PLACED, core.RUNNING})


@dataclass(frozen=True)
class Side:
    """One side's tip of a ref: who held it (node, ownership epoch), the tip and its tree,
    and the task view folded from it (None for a non-task ref)."""

    node: str
    owner_epoch: int
    tip: str
    tree: str
    view: TaskView | None = None
    failover: str = SPLIT_BRAIN_ALLOWED


@dataclass(frozen=True)
class Merge:
    """The commit to write: `parents` (survivor first), `tree`, and `transition` (None for
    a non-task ref: a plain merge with only the trailer). `trailers` are for non-task refs;
    a task ref carries the same trailer in `transition.extra`."""

    ref: str
    parents: tuple[str, ...]
    tree: str
    transition: Transition | None
    trailers: tuple[tuple[str, str], ...] = field(default_factory=tuple)

    @property
    def subject(self) -> str:
        return f"kovanex: reconcile {self.ref} after a partition"


def describe(ours: Side | None, theirs: Side) -> str:
    """The trailer's value: which sides and which tips, e.g.
    `ours=n2@2:<oid> theirs=n1@1:<oid>` (`ours=none` for a branch only they had)."""
    o = f"ours={ours.node}@{ours.owner_epoch}:{ours.tip}" if ours else "ours=none"
    return f"{o} theirs={theirs.node}@{theirs.owner_epoch}:{theirs.tip}"


def merged_state(ours: TaskView | None, theirs: TaskView) -> tuple[str, int]:
    """(state, epoch) of the reconciled task; see the module doc for the rules."""
    views = [v for v in (ours, theirs) if v is not None]
    top = max(v.epoch for v in views)
    states = {v.state for v in views}
    if core.SUCCEEDED in states:
        return core.SUCCEEDED, top
    if core.CANCELLED in states:
        return core.CANCELLED, top
    if states == {core.FAILED}:
        return core.FAILED, top
    return core.QUEUED, top + 1


def choose_tree(ours: str | None, theirs: str, base: str | None) -> str:
    """3-way at tree level: keep the side that changed the tree since the base."""
    if ours is None:
        return theirs
    if base is not None and ours == base:
        return theirs
    return ours


def reconcile(
    ref: str, ours: Side | None, theirs: Side, *, contained: bool, base_tree: str | None
) -> Merge | None:
    """The commit that brings `theirs` into `ref` on the survivor, or None when nothing is
    to be done: their tip is already in our history (`contained`), or the task asks for
    absolute consistency. An absent `ours` with no lease to fence is adopted as is (a Merge
    with their tip as the only parent and no transition means: set the ref there)."""
    if contained:
        return None
    if ours is not None and ABSOLUTE_CONSISTENCY in (theirs.failover, ours.failover):
        return None  # never merged; one only the deposed side has is adopted (module doc)
    tag = describe(ours, theirs)
    tree = choose_tree(ours.tree if ours else None, theirs.tree, base_tree)
    parents = (ours.tip, theirs.tip) if ours is not None else (theirs.tip,)
    if theirs.view is None:  # a plain branch
        if ours is None:
            return Merge(ref, (theirs.tip,), theirs.tree, None)
        return Merge(ref, parents, tree, None, ((f"{core.PREFIX}{TRAILER}", tag),))
    if ours is None and theirs.view.state not in LIVE_LEASE:
        return Merge(ref, (theirs.tip,), theirs.tree, None)  # adopt: nothing to fence
    our_view = ours.view if ours is not None else None
    state, epoch = merged_state(our_view, theirs.view)
    keep = our_view if our_view is not None else theirs.view
    reason = "reconciled after a partition: " + (
        "both sides' histories kept" if ours is not None else "lease from the deposed side fenced"
    )
    tr = Transition(
        state=state,
        epoch=epoch,
        attempt=keep.attempt,
        reason=reason,
        extra={TRAILER: tag},
    )
    return Merge(ref, parents, tree, tr)


def adopt_only(m: Merge) -> bool:
    """True when the shell only has to set the ref to the single parent (no new commit)."""
    return m.transition is None and not m.trailers and len(m.parents) == 1


__all__ = [
    "ABSOLUTE_CONSISTENCY",
    "LIVE_LEASE",
    "SPLIT_BRAIN_ALLOWED",
    "TRAILER",
    "Merge",
    "Side",
    "adopt_only",
    "choose_tree",
    "describe",
    "merged_state",
    "reconcile",
]
