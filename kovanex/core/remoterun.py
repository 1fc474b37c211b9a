"""Runs of other owners' tasks on this node: what to start, redeliver, stand down or hand
back (ADR 0008, 0016, 0031; issue 25 part 5, ADR 0091). agent/remoterun.py is the shell.

Why these rules:
- An owner assigns a lease over gossip (topic `assign`, key repo/task). A gossip value is
  only a hint: every start reads the owner's branch first (`StartRead`), and only a
  `placed` lease for us at the assigned epoch runs. A `running` one for us is our own run
  from before a restart: it goes back to the owner under a new epoch.
- A newer lease for us while an older run of the task is here (a deposed owner's own run)
  waits in `pending` and starts when that run ends; the old run stands down only if the
  owner's branch confirms the move (`SupersedeRead`).
- A watched run whose `assign` key is retracted or moved is checked against the owner's
  branch and stood down if its lease moved (`VerifyRead`): no polling, the runner's next
  CAS is refused anyway.
- A crashed run (e.g. the owner unreachable for a moment after a heal) is delivered again
  after `redeliver_s`, since nothing on the owner's side re-places a lease whose holder is
  alive; after `redeliver_max` crashes its lease is handed back to the owner.
- A hand-back requeues a lease the owner says we hold at `epoch` though no run of it is
  here (`HandBackRead`); the epoch CAS refuses it if the lease moved meanwhile.

Shape: `decide(state, event, now) -> (state, effects)` (core/decider.py). Gossip values
arrive as the dicts gossip carries; a malformed one is ignored.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from kovanex.core import task as taskcore

Key = tuple[str, str]  # (repo, task_id)
HELD = frozenset({taskcore.PLACED, taskcore.RUNNING})
REDELIVER_S = 2.0  # after a remote run crashed, before its assignment is tried again
REDELIVER_MAX = 3  # crashes of a task's runs here retried here; then it goes back to its owner


@dataclass(frozen=True)
class RemoteRunState:
    me: str
    redeliver_s: float = REDELIVER_S
    redeliver_max: int = REDELIVER_MAX
    pending: Mapping[Key, Mapping[str, Any]] = field(default_factory=dict)
    crashes: Mapping[Key, int] = field(default_factory=dict)


# -- events --------------------------------------------------------------------------------
@dataclass(frozen=True)
class AssignSeen:
    """The `assign` key `key` changed to `value` (None: retracted). `watched_epoch`: the
    epoch of the run of `key` we watch, if any; `running_epoch`: of the run here of the
    task `value` names, if any."""

    key: Key
    value: Any
    watched_epoch: int | None = None
    running_epoch: int | None = None


@dataclass(frozen=True)
class RunEnded:
    """A run of `key` ended. `running`: another run of it is here now; `crashed_epoch`:
    the epoch of the watched run that ended, when it crashed."""

    key: Key
    running: bool = False
    crashed_epoch: int | None = None


@dataclass(frozen=True)
class RedeliverDue:
    """`redeliver_s` passed since a crash: the `assign` value now, and whether a run of
    the task is here."""

    key: Key
    value: Any
    running: bool


@dataclass(frozen=True)
class OwnerLease:
    """The lease on the owner's branch as read now."""

    state: str
    node: str | None
    epoch: int


@dataclass(frozen=True)
class StartRead:
    """The owner's branch read before starting the assignment `epoch` of `key`."""

    key: Key
    epoch: int
    lease: OwnerLease


@dataclass(frozen=True)
class SupersedeRead:
    """The owner's branch read after a newer lease (`epoch`) came for a task running here."""

    key: Key
    epoch: int
    lease: OwnerLease


@dataclass(frozen=True)
class VerifyRead:
    """The owner's branch read after the `assign` key of our watched run moved."""

    key: Key
    run_epoch: int
    lease: OwnerLease


@dataclass(frozen=True)
class HandBackRead:
    """The owner's branch read before handing back our lease `epoch` of `key`."""

    key: Key
    epoch: int
    why: str
    lease: OwnerLease
    running: bool


Event = AssignSeen | RunEnded | RedeliverDue | StartRead | SupersedeRead | VerifyRead | HandBackRead


# -- effects -------------------------------------------------------------------------------
@dataclass(frozen=True)
class LearnOwner:
    """`url` serves `repo` (the owner's base URL an assignment named)."""

    repo: str
    url: str


@dataclass(frozen=True)
class Start:
    """Read the owner's branch for this assignment, then start it (`StartRead` decides)."""

    value: Mapping[str, Any]
    again: bool = False  # a redelivery after a crash


@dataclass(frozen=True)
class Busy:
    """An assignment at `epoch` came while a run of the task is here (logged)."""

    key: Key
    epoch: int


@dataclass(frozen=True)
class Supersede:
    """Read the owner's branch; a lease moved to us at `epoch` stands the old run down."""

    key: Key
    epoch: int


@dataclass(frozen=True)
class Verify:
    """Read the owner's branch for our watched run of `key` (`VerifyRead` decides)."""

    key: Key


@dataclass(frozen=True)
class RedeliverAt:
    """Feed `RedeliverDue` for `key` at `at`."""

    key: Key
    at: float


@dataclass(frozen=True)
class HandBack:
    """Read the owner's branch and requeue our lease `epoch` there (`HandBackRead`)."""

    key: Key
    epoch: int
    why: str


@dataclass(frozen=True)
class Stale:
    """The assignment is not the lease on the owner's branch: dropped (logged)."""

    key: Key
    epoch: int
    lease: OwnerLease


@dataclass(frozen=True)
class Requeue:
    """Requeue the lease just read on the owner's branch (CAS on its tip and epoch)."""

    key: Key
    reason: str


@dataclass(frozen=True)
class RunHere:
    """The lease `epoch` of `key` is ours and placed: take a runner slot and run it."""

    key: Key
    epoch: int


@dataclass(frozen=True)
class StandDown:
    """Stop our run of `key` without writing: its lease moved."""

    key: Key
    reason: str


Effect = (
    LearnOwner | Start | Busy | Supersede | Verify | RedeliverAt | HandBack | Stale | Requeue
    | RunHere | StandDown
)  # fmt: skip


def assignment(value: Any) -> tuple[Key, int, str, str] | None:
    """(key, epoch, node, url) of a well-formed `assign` value, else None."""
    if not isinstance(value, Mapping):
        return None
    try:
        key = (str(value["repo"]), str(value["task"]))
        return key, int(value.get("epoch", 0)), str(value.get("node")), str(value["url"])
    except (KeyError, TypeError, ValueError):
        return None


def to_reannounce(values: Mapping[str, Any], owner: str, node: str) -> list[str]:
    """The `assign` keys `owner` publishes again when `node` joins again (back from dead:
    a heal, a restart). Their broadcast may have spent its retransmits while `node` was cut
    off; it would hear of them only at the next push-pull, past the placement deadline,
    which then excludes it (issue 25 bug 9, KOVANEX_SEED=16)."""
    return sorted(
        k
        for k, v in values.items()
        if isinstance(v, Mapping) and v.get("owner") == owner and v.get("node") == node
    )


def owner_lease(view: taskcore.TaskView) -> OwnerLease:
    return OwnerLease(view.state, view.node, view.epoch)


def moved(lease: OwnerLease) -> str:
    return f"lease moved on the owner: {lease.state} {lease.node}@{lease.epoch}"


# -- the decider -----------------------------------------------------------------------------
def decide(s: RemoteRunState, ev: Event, now: float) -> tuple[RemoteRunState, list[Effect]]:
    if isinstance(ev, AssignSeen):
        return _assigned(s, ev)
    if isinstance(ev, RunEnded):
        return _ended(s, ev, now)
    if isinstance(ev, RedeliverDue):
        a = assignment(ev.value)
        if a is None or a[2] != s.me or ev.running:
            return s, []
        return s, [Start(ev.value, again=True)]
    lease = ev.lease
    mine = lease.node == s.me
    if isinstance(ev, StartRead):
        if not mine or lease.epoch != ev.epoch:
            return s, [Stale(ev.key, ev.epoch, lease)]
        if lease.state == taskcore.RUNNING:  # our lease from before a restart
            return s, [Requeue(ev.key, f"agent {s.me} restarted; rescheduling")]
        return s, [RunHere(ev.key, ev.epoch)] if lease.state == taskcore.PLACED else []
    if isinstance(ev, SupersedeRead):
        if mine and lease.epoch == ev.epoch and lease.state in HELD:
            return s, [StandDown(ev.key, moved(lease))]
        return s, []
    if isinstance(ev, VerifyRead):
        if lease.epoch != ev.run_epoch or not mine or lease.state not in HELD:
            return s, [StandDown(ev.key, moved(lease))]
        return s, []
    if lease.state in HELD and mine and lease.epoch == ev.epoch and not ev.running:
        return s, [Requeue(ev.key, ev.why)]
    return s, []


def _assigned(s: RemoteRunState, ev: AssignSeen) -> tuple[RemoteRunState, list[Effect]]:
    a = assignment(ev.value)
    if ev.watched_epoch is not None and (a is None or (a[2], a[1]) != (s.me, ev.watched_epoch)):
        return s, [Verify(ev.key)]  # retracted (final: cancelled...) or moved elsewhere
    if a is None or a[2] != s.me:
        return s, []
    key, epoch, _node, url = a
    out: list[Effect] = [LearnOwner(key[0], url)]
    if ev.running_epoch is None:
        return s, [*out, Start(ev.value)]
    out.append(Busy(key, epoch))
    if epoch > ev.running_epoch:  # not our own run's echo
        s = replace(s, pending={**s.pending, key: ev.value})
        out.append(Supersede(key, epoch))
    return s, out


def _ended(s: RemoteRunState, ev: RunEnded, now: float) -> tuple[RemoteRunState, list[Effect]]:
    value = s.pending.get(ev.key)
    if value is not None:
        s = replace(s, pending={k: v for k, v in s.pending.items() if k != ev.key})
        if not ev.running:
            return s, [Start(value)]
    if ev.crashed_epoch is None:
        return s, []
    n = s.crashes.get(ev.key, 0) + 1
    s = replace(s, crashes={**s.crashes, ev.key: n})
    if n > s.redeliver_max:
        why = f"its runs on {s.me} crashed {s.redeliver_max} times"
        return s, [HandBack(ev.key, ev.crashed_epoch, why)]
    return s, [RedeliverAt(ev.key, now + s.redeliver_s)]
