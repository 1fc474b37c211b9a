"""Where a task goes and when it is queued again: the owner's scheduling decisions, pure.

The agent's services read the branches (a `TaskView` per task), score the nodes
(`Decision`, from the placer) and the membership view, and hand them here; this module
returns effects (`core/effects.py`): a CAS-written transition, a run to start, an
assignment to announce, a run to stop. Nothing here reads a ref or the clock, so the
whole-cluster simulator (`kovanex.sim`) drives the same code as a real agent.

The protocol with the shell is the one every write follows (ADR 0002): execute the
effects in order, stop at the first refused write, then re-read the task and call
`observe` again. The decider never assumes a write landed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from kovanex.core import task as taskcore
from kovanex.core.effects import (
    Assign,
    KillOrphan,
    QueueSubmission,
    StandDown,
    StartRun,
    WriteRef,
)

Key = tuple[str, str]  # (repo, task id)
Effect = WriteRef | QueueSubmission | StartRun | Assign | StandDown | KillOrphan
WAITING = frozenset({taskcore.QUEUED, taskcore.UNSCHEDULABLE})
HELD = frozenset({taskcore.PLACED, taskcore.RUNNING})
GONE = frozenset({"dead", "left"})
DEFAULT_PRIORITY = 50


@dataclass(frozen=True)
class Decision:
    """The placer's answer for one task: a node, or why not (and whether to wait)."""

    node: str | None = None
    reason: str = ""
    waiting: bool = False  # feasible, but not now: keep queued without writing
    extra: dict[str, str] = field(default_factory=dict)


class Scheduler:
    """The owner's queue of tasks waiting for placement, and the rules that move them.

    `pending` maps a task to (tip, priority) as last seen, so a pass costs O(pending)
    instead of re-reading every history.
    """

    def __init__(self, node: str) -> None:
        self.node = node
        self.pending: dict[Key, tuple[str, int]] = {}

    def observe(
        self,
        repo: str,
        view: taskcore.TaskView,
        *,
        run_epoch: int | None,
        priority: Callable[[], int],
        skipped: bool = False,
    ) -> list[Effect]:
        """React to what a branch says now. `run_epoch` is the epoch of our run of the task
        (None: no run here); `priority` is asked only when the task joins the queue."""
        key = (repo, view.task_id)
        out: list[Effect] = []
        if run_epoch is not None and (
            view.epoch != run_epoch or view.node != self.node or view.state not in HELD
        ):
            out.append(
                StandDown(repo, view.task_id, f"task is now {view.state} {view.node}@{view.epoch}")
            )
        if view.state == taskcore.SUBMITTED:
            self.pending.pop(key, None)
            if not skipped:
                out.append(QueueSubmission(repo, view.task_id))
        elif view.state in WAITING:
            if self.pending.get(key, ("",))[0] != view.tip:
                self.pending[key] = (view.tip, priority())
        elif view.state in HELD and view.node == self.node and run_epoch is None:
            # Our lease, but nothing runs it here: we restarted. Fence the old lease with
            # a new epoch and place again; finished steps are kept.
            self.pending.pop(key, None)
            out.append(KillOrphan(repo, view.task_id))
            tr = taskcore.requeue(view, f"agent {self.node} restarted; resuming")
            out.append(WriteRef(repo, view.task_id, tr, view.tip))
        else:
            self.pending.pop(key, None)
        return out

    def order(self) -> list[Key]:
        """Tasks to place this pass: highest priority first, then a stable order."""
        return [k for _, _, k in sorted((-p, tip, k) for k, (tip, p) in self.pending.items())]

    def decide(
        self, repo: str, view: taskcore.TaskView, decision: Decision, *, slot_free: bool
    ) -> list[Effect]:
        """Turn the placer's decision into the placement (or the reason it waits)."""
        key = (repo, view.task_id)
        if view.state not in WAITING:
            self.pending.pop(key, None)
            return []
        if decision.waiting:
            return []  # capacity will free up; stay queued without writing
        if decision.node is None:
            if view.state == taskcore.UNSCHEDULABLE and view.reason == " ".join(
                decision.reason.split()
            ):
                return []  # already says so: no commit per pass
            tr = taskcore.mark_unschedulable(view, decision.reason)
            return [WriteRef(repo, view.task_id, tr, view.tip)]
        if decision.node == self.node and not slot_free:
            return []  # a slot release kicks another pass
        self.pending.pop(key, None)
        tr = taskcore.place(view, decision.node, decision.extra)
        if decision.node == self.node:
            # Placed here with a slot in hand: `running` follows at once, so `placed` and
            # `running` are written as two commits with one CAS (issue 11). `git log` keeps
            # both states; the run finds its lease already running and goes on from there.
            placed = taskcore.apply(view, "", tr)
            running = taskcore.start(placed, self.node, tr.epoch)
            return [
                WriteRef(repo, view.task_id, tr, view.tip, then=(running,)),
                StartRun(repo, view.task_id, tr.epoch),
            ]
        then = Assign(repo, view.task_id, decision.node, tr.epoch)
        return [WriteRef(repo, view.task_id, tr, view.tip), then]

    def place_fresh(
        self,
        repo: str,
        view: taskcore.TaskView,
        queued: taskcore.Transition,
        decision: Decision,
        *,
        slot_free: bool,
    ) -> list[Effect]:
        """A fresh submission that finds a local slot and its grant in hand: `queued`,
        `placed` and `running` are all known at once, so they are one chain, one CAS
        (ADR 0108). [] leaves it to the usual path (`queued` alone, placed by a pass):
        no slot here, a placement elsewhere or none, or a task already waiting that this
        one must not overtake (same or higher priority; `order` would place it first)."""
        if view.state != taskcore.SUBMITTED or queued.state != taskcore.QUEUED:
            return []
        if decision.waiting or decision.node != self.node or not slot_free:
            return []
        prio = int(queued.extra.get("Priority", DEFAULT_PRIORITY))
        if any(p >= prio for _, p in self.pending.values()):
            return []
        self.pending.pop((repo, view.task_id), None)
        in_queue = taskcore.apply(view, "", queued)
        placed = taskcore.place(in_queue, self.node, decision.extra)
        running = taskcore.start(taskcore.apply(in_queue, "", placed), self.node, placed.epoch)
        return [
            WriteRef(repo, view.task_id, queued, view.tip, then=(placed, running)),
            StartRun(repo, view.task_id, placed.epoch),
        ]


def requeue_held_by(repo: str, view: taskcore.TaskView, failed: str) -> list[Effect]:
    """A failed node's lease goes back to the queue under a new epoch: the next holder
    resumes after the last step commit, and the old holder is fenced out."""
    if view.node != failed or view.state not in HELD:
        return []
    tr = taskcore.requeue(view, f"node {failed} failed; rescheduling")
    return [WriteRef(repo, view.task_id, tr, view.tip)]


def failed_holders(
    views: Iterable[taskcore.TaskView], status: Mapping[str, str], me: str
) -> list[str]:
    """Holders of live leases whom membership reports dead or left: the sweep's backstop
    for a missed member-failed event."""
    out = {
        v.node
        for v in views
        if v.state in HELD and v.node and v.node != me and status.get(v.node) in GONE
    }
    return sorted(out)


def priority_of(history: Iterable[taskcore.Transition | None], scan: int = 20) -> int:
    """The priority a task was queued with (newest `Kovanex-Priority` trailer)."""
    for i, tr in enumerate(history):
        if i >= scan:
            break
        if tr is not None and "Priority" in tr.extra:
            try:
                return int(tr.extra["Priority"])
            except ValueError:
                return DEFAULT_PRIORITY
    return DEFAULT_PRIORITY
