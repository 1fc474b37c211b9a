"""No task stuck in `placed`: the placement deadline and per-task node exclusions, pure.

A lease is only useful once its holder starts the task. If the runner cannot (it has no
cluster secret and gets 401 from the owner, it crashed before starting, it never heard of
the assignment), the owner must take the task back under a new epoch and try elsewhere.
The owner's shell feeds this module what it saw (when it first saw the lease, and any
failure the runner reported over gossip) and the clock; it returns the requeue to write.

Exclusions live in the task's own history (`Kovanex-Excluded: n3,n4` on the requeue
commit), so they survive an agent restart and a change of owner. They last for the
current generation: a new push (a user commit) starts afresh. They are also cleared,
with a `Kovanex-Excluded-Cleared: <nodes>` trailer so the history says who was let back
(ADR 0078): by a person's `task retry`, ScheduleTask or RescheduleTask (`revive`), and
for one node when it joins the cluster again after being dead or gone (`rejoined`): a
restarted runner is a new process and deserves a new try. And they lapse (`lapse`, issue
25 bug 9): a task kept from an idle matching node only by its exclusions is placed there
again after a backoff, so a runner that missed the deadline once (cut off, restarted, a
loaded host) is not shut out until a person or a new push notices.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from kovanex.core import task as taskcore
from kovanex.core.scoring import NodeInfo

EXCLUDED = "Excluded"  # extra-trailer key: Kovanex-Excluded
CLEARED = "Excluded-Cleared"  # Kovanex-Excluded-Cleared: the nodes let back in
REASON_MAX = 200
LAPSE_MAX_S = 300.0  # the longest an idle matching node stays shut out of a task


@dataclass(frozen=True)
class StartFailure:
    """A runner's own report that it could not start a lease (e.g. fetch got 401)."""

    node: str
    epoch: int
    reason: str
    exclude: bool = True  # False for "no free slot right now": try it again later


@dataclass(frozen=True)
class Watch:
    """A lease the owner is waiting to see `running`: who holds it, since when (owner clock)."""

    node: str
    epoch: int
    since: float


def excluded(history: Iterable[taskcore.Transition | None]) -> frozenset[str]:
    """Nodes excluded for this task in its current generation (history newest first, may
    be lazy). Each requeue carries the whole set so far, so the newest one is enough."""
    for tr in history:
        if tr is None:
            break  # a user commit: older exclusions belong to an earlier generation
        if EXCLUDED in tr.extra:
            return frozenset(parse_excluded(tr.extra[EXCLUDED]))
        if CLEARED in tr.extra:
            break  # older exclusions were cleared
    return frozenset()


def cleared(tr: taskcore.Transition, names: frozenset[str], keep: frozenset[str] = frozenset()
            ) -> taskcore.Transition:  # fmt: skip
    """`tr` carrying the audit trail of an exclusion clear: the nodes let back in, and
    the ones still excluded (if any)."""
    if not names:
        return tr
    extra = {**tr.extra, CLEARED: ",".join(sorted(names))}
    if keep:
        extra[EXCLUDED] = ",".join(sorted(keep))
    return replace(tr, extra=extra)


def retried(view: taskcore.TaskView, excl: frozenset[str]) -> taskcore.Transition:
    """`task retry` / RetryTask: a failed, cancelled or unschedulable task back to the
    queue, its node exclusions cleared (a held lease is RescheduleTask's, not retry's)."""
    return cleared(taskcore.retry(view), excl)


def revive(view: taskcore.TaskView, excl: frozenset[str], why: str) -> taskcore.Transition:
    """What a person's retry, ScheduleTask or RescheduleTask writes: a held lease is
    requeued, a failed, cancelled or unschedulable task goes back to the queue; either way
    every node exclusion is cleared. Raises IllegalTransition (naming the states) else."""
    if view.state in (taskcore.PLACED, taskcore.RUNNING):
        tr = taskcore.requeue(view, why)
    else:
        tr = taskcore.retry(view)
    return cleared(tr, excl)


def rejoined(
    view: taskcore.TaskView, excl: frozenset[str], node: str
) -> taskcore.Transition | None:
    """`node` joined again (restarted, or back after being declared dead): an
    unschedulable task that excluded it is queued again with `node` let back in."""
    if view.state != taskcore.UNSCHEDULABLE or node not in excl:
        return None
    tr = taskcore.retry(view)
    tr = replace(tr, reason=f"node {node} joined again; its exclusion is cleared")
    return cleared(tr, frozenset({node}), excl - {node})


@dataclass(frozen=True)
class Lapse:
    """The owner's memory of a task its exclusions alone keep from an idle matching node:
    `since` when it saw that (owner clock; None: not now), `tries` the times they lapsed
    for it already (the backoff: a node that fails every time is let back ever more rarely)."""

    since: float | None
    tries: int = 0


def lapse_after(tries: int, deadline: float) -> float:
    """How long the exclusions hold before they lapse: the placement deadline, doubled per
    lapse already spent on this task, at most LAPSE_MAX_S."""
    return min(deadline * 2 ** min(tries, 16), LAPSE_MAX_S)


def lapse(
    cur: Lapse | None, held_back: frozenset[str], now: float, deadline: float
) -> tuple[Lapse | None, frozenset[str]]:
    """`held_back`: the excluded nodes that would take the task now (alive, matching, a
    runner free). Returns the memory to keep and the nodes to let back in now (none until
    the backoff is over). Nothing held back: the clock stops, the tries are kept."""
    tries = cur.tries if cur is not None else 0
    if not held_back:
        return (Lapse(None, tries) if tries else None), frozenset()
    since = cur.since if cur is not None and cur.since is not None else now
    if now - since < lapse_after(tries, deadline):
        return Lapse(since, tries), frozenset()
    return Lapse(None, tries + 1), held_back


def lapsed_extra(
    extra: dict[str, str], let: frozenset[str], excl: frozenset[str]
) -> dict[str, str]:
    """The placement's trailers when it lets `let` back in: the audit trail of the clear
    (`Kovanex-Excluded-Cleared`), and the exclusions that still hold."""
    out = {**extra, CLEARED: ",".join(sorted(let))}
    if excl - let:
        out[EXCLUDED] = ",".join(sorted(excl - let))
    return out


def candidates(nodes: Sequence[NodeInfo], names: frozenset[str]) -> list[NodeInfo]:
    """The nodes placement may consider for this task: all but the excluded ones."""
    return [n for n in nodes if n.name not in names]


def parse_excluded(value: str) -> set[str]:
    return {n.strip() for n in value.split(",") if n.strip()}


def watch(view: taskcore.TaskView, current: Watch | None, now: float) -> Watch | None:
    """Start (or keep) the clock for a placed lease; None once it runs or moves on."""
    if view.state != taskcore.PLACED or not view.node:
        return None
    if current is not None and (current.node, current.epoch) == (view.node, view.epoch):
        return current
    return Watch(view.node, view.epoch, now)


def decide(
    view: taskcore.TaskView,
    w: Watch | None,
    now: float,
    deadline: float,
    failure: StartFailure | None,
    already: frozenset[str],
) -> taskcore.Transition | None:
    """The requeue to write for an overdue or failed lease, or None to keep waiting.

    A reported failure acts at once; silence acts at the deadline. Either way the holder
    is added to the task's exclusions, so re-placement picks another node.
    """
    if view.state != taskcore.PLACED or not view.node:
        return None
    skip = True
    if failure is not None and (failure.node, failure.epoch) == (view.node, view.epoch):
        why = f"runner {view.node} {_short(failure.reason)}"
        skip = failure.exclude
    elif (
        w is not None and (w.node, w.epoch) == (view.node, view.epoch) and now - w.since >= deadline
    ):
        why = f"runner {view.node} did not start the task within {deadline:g}s"
    else:
        return None
    tr = taskcore.requeue(view, why)
    names = already | {view.node} if skip else already
    if not names:
        return tr
    return replace(tr, extra={**tr.extra, EXCLUDED: ",".join(sorted(names))})


def due_at(w: Watch | None, deadline: float) -> float | None:
    """When the shell should look again (owner clock), for a sleep with a purpose."""
    return None if w is None else w.since + deadline


def all_excluded_reason(names: frozenset[str], reason: str) -> str:
    """Why nothing was placed when only excluded nodes could have taken the task."""
    return (
        f"every node that could run this task failed to start it ({', '.join(sorted(names))}); "
        f"without them: {reason}; `kovanex task retry` lets them try again, or add a node"
    )


def _short(reason: str) -> str:
    one = " ".join(reason.split())
    return one if len(one) <= REASON_MAX else one[: REASON_MAX - 1] + "…"
