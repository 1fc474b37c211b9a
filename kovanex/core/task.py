"""The task state machine, pure: it folds a branch's commits into a view and decides the next
transition. The ledger (kovanex/gitstate/ledger.py) writes what this module decides.

Transition table (h11 style: the table is the source of truth, the functions below check it).

    event          from                                         to
    -------------  -------------------------------------------  ---------------------------
    queue          submitted                                    queued
    place          queued, unschedulable                        placed        (epoch + 1)
    unschedulable  queued, unschedulable                        unschedulable
    start          placed (same node and epoch as the lease)    running
    step           running                                      running       (step commit)
    reattempt      running (a step failed, attempts remain)     running       (attempt + 1)
    succeed        running (the last step finished ok)          succeeded
    fail           running (a step failed, no attempts left)    failed
    requeue        placed, running (failover)                   queued        (epoch + 1)
    cancel         queued, unschedulable, placed, running       cancelled     (epoch + 1)
    retry          failed, cancelled, unschedulable                queued   (exclusions cleared)
    reconcile      any (a merge after a partition heals)        core/reconcile.py decides

`submitted` is not written by anyone: it is what a branch whose tip is a user commit looks
like. A user commit on top of kovanex commits starts a new *generation*; the epoch carries over
(it is the max seen anywhere in the history), so a runner holding a lease from the previous
generation stays fenced out.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

SUBMITTED = "submitted"
QUEUED = "queued"
PLACED = "placed"
RUNNING = "running"
SUCCEEDED = "succeeded"
FAILED = "failed"
CANCELLED = "cancelled"
UNSCHEDULABLE = "unschedulable"

STATES = (QUEUED, PLACED, RUNNING, SUCCEEDED, FAILED, CANCELLED, UNSCHEDULABLE)
TERMINAL = frozenset({SUCCEEDED, FAILED, CANCELLED})
RESULTS = ("ok", "failed", "timeout", "killed", "oom")

TRANSITIONS: dict[str, dict[str, str]] = {
    SUBMITTED: {"queue": QUEUED},
    QUEUED: {"place": PLACED, "unschedulable": UNSCHEDULABLE, "cancel": CANCELLED},
    UNSCHEDULABLE: {
        "place": PLACED,
        "unschedulable": UNSCHEDULABLE,
        "cancel": CANCELLED,
        "retry": QUEUED,
    },
    PLACED: {"start": RUNNING, "requeue": QUEUED, "cancel": CANCELLED},
    RUNNING: {
        "step": RUNNING,
        "reattempt": RUNNING,
        "succeed": SUCCEEDED,
        "fail": FAILED,
        "requeue": QUEUED,
        "cancel": CANCELLED,
    },
    SUCCEEDED: {},
    FAILED: {"retry": QUEUED},
    CANCELLED: {"retry": QUEUED},
}

# Trailer keys, in the order they are written.
T_STATE = "Kovanex-State"
T_EPOCH = "Kovanex-Epoch"
T_NODE = "Kovanex-Node"
T_STEP = "Kovanex-Step"
T_RESULT = "Kovanex-Result"
T_EXIT = "Kovanex-Exit-Code"
T_ATTEMPT = "Kovanex-Attempt"
T_REASON = "Kovanex-Reason"
T_TASK = "Kovanex-Task"
PREFIX = "Kovanex-"
_KNOWN = {k.lower() for k in (T_STATE, T_EPOCH, T_NODE, T_STEP, T_RESULT, T_EXIT, T_ATTEMPT)}
_KNOWN |= {T_REASON.lower(), T_TASK.lower()}
_EXTRA_KEY = re.compile(r"^[A-Za-z0-9][A-Za-z0-9-]*$")
# "Kovanex-Step: 2/3 test" = the second of three steps (1-based for humans; Transition.step
# is the 0-based index).
_STEP_RE = re.compile(r"^(\d+)/(\d+) (\S+)$")


class IllegalTransition(Exception):
    """A decision that the table forbids; the caller re-reads instead of writing."""


@dataclass(frozen=True)
class Transition:
    """One state-changing commit, as data. Kovanex-Task is added by the ledger."""

    state: str
    epoch: int
    node: str = ""
    step: int | None = None
    step_name: str = ""
    result: str = ""
    exit_code: int | None = None
    attempt: int = 0
    reason: str = ""
    extra: dict[str, str] = field(default_factory=dict)
    total: int = 0  # number of steps, for the human-readable "Kovanex-Step: 2/3 name"

    def to_trailers(self) -> list[tuple[str, str]]:
        """Trailer pairs; values are flattened to one line so `git interpret-trailers` agrees."""
        out = [(T_STATE, self.state), (T_EPOCH, str(self.epoch))]
        if self.node:
            out.append((T_NODE, _one_line(self.node)))
        if self.step is not None:
            out.append(
                (T_STEP, f"{self.step + 1}/{max(self.total, self.step + 1)} {self.step_name}")
            )
        if self.result:
            out.append((T_RESULT, self.result))
        if self.exit_code is not None:
            out.append((T_EXIT, str(self.exit_code)))
        out.append((T_ATTEMPT, str(self.attempt)))
        if self.reason:
            out.append((T_REASON, _one_line(self.reason)))
        for k in sorted(self.extra):
            if not _EXTRA_KEY.match(k) or f"{PREFIX}{k}".lower() in _KNOWN:
                raise ValueError(f"bad extra trailer key {k!r}")
            out.append((f"{PREFIX}{k}", _one_line(self.extra[k])))
        return out

    @classmethod
    def from_trailers(cls, trailers: Mapping[str, str]) -> Transition | None:
        """None for a commit that is not a (well-formed) kovanex transition: a user commit."""
        t = {k.lower(): v for k, v in trailers.items()}
        state = t.get(T_STATE.lower())
        if state not in STATES:
            return None
        try:
            epoch = int(t.get(T_EPOCH.lower(), "0"))
            attempt = int(t.get(T_ATTEMPT.lower(), "0"))
            exit_raw = t.get(T_EXIT.lower())
            exit_code = int(exit_raw) if exit_raw is not None else None
        except ValueError:
            return None
        step: int | None = None
        name, total = "", 0
        if T_STEP.lower() in t:
            m = _STEP_RE.match(t[T_STEP.lower()])
            if not m or int(m.group(1)) < 1:
                return None
            step, total, name = int(m.group(1)) - 1, int(m.group(2)), m.group(3)
        extra = {
            k[len(PREFIX) :]: v
            for k, v in trailers.items()
            if k.lower().startswith(PREFIX.lower()) and k.lower() not in _KNOWN
        }
        return cls(
            state=state,
            epoch=epoch,
            node=t.get(T_NODE.lower(), ""),
            step=step,
            step_name=name,
            result=t.get(T_RESULT.lower(), ""),
            exit_code=exit_code,
            attempt=attempt,
            reason=t.get(T_REASON.lower(), ""),
            extra=extra,
            total=total,
        )


def _one_line(s: str) -> str:
    return " ".join(s.split())


@dataclass(frozen=True)
class TaskView:
    """What a branch says about its task, folded from the commits."""

    task_id: str
    state: str
    epoch: int
    node: str = ""
    attempt: int = 0
    steps_ok: tuple[int, ...] = ()
    last_result: str = ""
    reason: str = ""
    tip: str = ""


def fold(task_id: str, commits: Iterable[tuple[str, Transition | None]]) -> TaskView:
    """Fold newest-first (oid, transition) pairs. User commits (None) end the current generation."""
    tip = ""
    epoch = 0
    gen: list[Transition] = []
    in_gen = True
    for oid, tr in commits:
        if not tip:
            tip = oid
        if tr is None:
            in_gen = False
            continue
        epoch = max(epoch, tr.epoch)
        if in_gen:
            gen.append(tr)
    if not gen:
        return TaskView(task_id=task_id, state=SUBMITTED, epoch=epoch, tip=tip)
    latest = gen[0]
    ok = sorted({t.step for t in gen if t.step is not None and t.result == "ok"})
    last_result = next((t.result for t in gen if t.result), "")
    return TaskView(
        task_id=task_id,
        state=latest.state,
        epoch=epoch,
        node=latest.node,
        attempt=latest.attempt,
        steps_ok=tuple(ok),
        last_result=last_result,
        reason=latest.reason,
        tip=tip,
    )


def _check(view: TaskView, event: str) -> str:
    to = TRANSITIONS.get(view.state, {}).get(event)
    if to is None:
        # name the states the event applies to, and the events this state allows: one
        # list of events read as states once gave "cannot retry from 'unschedulable'
        # (allowed: place, unschedulable, cancel)" (issue 25)
        applies = ", ".join(s for s, evs in TRANSITIONS.items() if event in evs) or "no state"
        here = ", ".join(TRANSITIONS.get(view.state, {})) or "nothing (terminal)"
        raise IllegalTransition(
            f"task {view.task_id}: cannot {event} a {view.state} task ({event} applies to "
            f"{applies} tasks; a {view.state} task allows: {here})"
        )
    return to


def queue(view: TaskView, priority: int, pushed_by: str | None = None) -> Transition:
    """A submitted branch enters the queue; the priority is recorded for schedulers, and
    who pushed it for the audit trail (`Kovanex-Pushed-By`)."""
    to = _check(view, "queue")
    extra = {"Priority": str(priority)}
    if pushed_by:
        extra["Pushed-By"] = pushed_by
    return Transition(state=to, epoch=view.epoch, extra=extra)


def place(view: TaskView, node: str, score_extra: Mapping[str, object] | None = None) -> Transition:
    """Every placement is a new lease: the epoch goes up, fencing any earlier holder."""
    to = _check(view, "place")
    if not node:
        raise IllegalTransition(f"task {view.task_id}: place needs a node")
    extra = {k: str(v) for k, v in (score_extra or {}).items()}
    return Transition(
        state=to, epoch=next_lease(view.epoch), node=node, attempt=view.attempt, extra=extra
    )


def next_lease(epoch: int) -> int:
    """The epoch of the next placement after `epoch`: each lease fences the one before,
    so a task queued at epoch N runs at N + 1 (what `task retry` tells the user)."""
    return epoch + 1


def mark_unschedulable(view: TaskView, reason: str) -> Transition:
    to = _check(view, "unschedulable")
    return Transition(state=to, epoch=view.epoch, reason=reason, attempt=view.attempt)


def start(view: TaskView, node: str, epoch: int) -> Transition:
    """Only the lease holder may start, and only under the lease's own epoch."""
    to = _check(view, "start")
    if node != view.node or epoch != view.epoch:
        raise IllegalTransition(
            f"task {view.task_id}: lease is {view.node}@{view.epoch}, not {node}@{epoch}"
        )
    return Transition(state=to, epoch=epoch, node=node, attempt=view.attempt)


def next_step(view: TaskView, total: int) -> int | None:
    """The lowest step not finished ok in this generation: where a resumed run continues."""
    done = set(view.steps_ok)
    return next((i for i in range(total) if i not in done), None)


def step_done(
    view: TaskView,
    index: int,
    name: str,
    total: int,
    result: str,
    exit_code: int | None,
    retries: int,
    duration_s: float | None = None,
) -> list[Transition]:
    """The step commit, plus the transition it implies (succeeded, failed or a new attempt).
    `duration_s`, the runner's own measure, rides along as `Kovanex-Duration`: every node
    that sees the commit (the event feed, the step-duration histogram) reads the same."""
    _check(view, "step")
    if result not in RESULTS:
        raise IllegalTransition(f"task {view.task_id}: unknown step result {result!r}")
    expected = next_step(view, total)
    if index != expected:
        raise IllegalTransition(
            f"task {view.task_id}: step {index} reported, but the next step is {expected}"
        )
    step = Transition(
        state=RUNNING,
        epoch=view.epoch,
        node=view.node,
        step=index,
        step_name=name,
        total=total,
        result=result,
        exit_code=exit_code,
        attempt=view.attempt,
        extra={} if duration_s is None else {"Duration": f"{max(0.0, duration_s):.3f}"},
    )
    if result == "ok":
        if next_step(_with_ok(view, index), total) is None:
            return [step, _lease_tr(view, _check(view, "succeed"))]
        return [step]
    why = f"step {index + 1}/{total} {name}: {result}" + (
        f" (exit {exit_code})" if exit_code is not None else ""
    )
    if view.attempt >= retries:
        return [step, _lease_tr(view, _check(view, "fail"), reason=why)]
    again = _lease_tr(view, _check(view, "reattempt"), reason=f"retrying after {why}")
    return [step, replace(again, attempt=view.attempt + 1)]


def _lease_tr(view: TaskView, state: str, reason: str = "") -> Transition:
    """A transition written under the current lease (same epoch, node and attempt)."""
    return Transition(
        state=state, epoch=view.epoch, node=view.node, attempt=view.attempt, reason=reason
    )


def _with_ok(view: TaskView, index: int) -> TaskView:
    return TaskView(
        task_id=view.task_id,
        state=view.state,
        epoch=view.epoch,
        steps_ok=tuple(sorted({*view.steps_ok, index})),
    )


def fail_run(view: TaskView, reason: str) -> Transition:
    """A run that cannot go on at all (its checkout could not be made): fail the task
    under its lease with the reason, rather than leave it `running` with nobody on it."""
    return _lease_tr(view, _check(view, "fail"), reason=_one_line(reason)[:300])


def requeue(view: TaskView, reason: str) -> Transition:
    """Failover: take the task back from a holder presumed dead; the epoch bump fences it."""
    to = _check(view, "requeue")
    return Transition(state=to, epoch=view.epoch + 1, reason=reason, attempt=view.attempt)


def cancel(view: TaskView, reason: str) -> Transition:
    """Cancel bumps the epoch so a runner still holding the old lease cannot write again."""
    to = _check(view, "cancel")
    return Transition(
        state=to, epoch=view.epoch + 1, node=view.node, reason=reason, attempt=view.attempt
    )


def retry(view: TaskView) -> Transition:
    """Back to the queue with a fresh attempt budget; steps already ok stay done. From
    `unschedulable` too: a person asking again is what revives it (the shells clear the
    task's node exclusions with it, core/startwatch.revive)."""
    to = _check(view, "retry")
    return Transition(state=to, epoch=view.epoch, reason=f"retry after {view.state}")


def apply(view: TaskView, oid: str, tr: Transition | None) -> TaskView:
    """The view after one more commit, without re-walking history (fold of [new] + old)."""
    if tr is None:
        return TaskView(task_id=view.task_id, state=SUBMITTED, epoch=view.epoch, tip=oid)
    steps_ok = view.steps_ok
    if view.state == SUBMITTED:
        steps_ok = ()
    if tr.step is not None and tr.result == "ok":
        steps_ok = tuple(sorted({*steps_ok, tr.step}))
    return TaskView(
        task_id=view.task_id,
        state=tr.state,
        epoch=max(view.epoch, tr.epoch),
        node=tr.node,
        attempt=tr.attempt,
        steps_ok=steps_ok,
        last_result=tr.result or (view.last_result if view.state != SUBMITTED else ""),
        reason=tr.reason,
        tip=oid,
    )


def fold_all(task_id: str, commits: Sequence[tuple[str, Transition | None]]) -> TaskView:
    """Same as `fold`, via `apply` oldest-first; tests check the two agree."""
    view = TaskView(task_id=task_id, state=SUBMITTED, epoch=0)
    for oid, tr in reversed(commits):
        view = apply(view, oid, tr)
    return view
