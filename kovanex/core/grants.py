"""The leader's single-decider decisions: who owns a repo that holds absolute-consistency
work after its owner is gone, and when such a task is re-placed (issue 12 part 2, ADR 0036).

Why the leader, and not the gossip takeover rule (core/takeover.py): two sides of a
partition each see the other's owner dead, and each would take the repo over at epoch + 1.
For split-brain-allowed work that is the price of availability (reconciled after the heal);
for absolute-consistency work it runs a task twice. Only the holder of the leader lease
(a quorum CAS in NATS JetStream KV) decides these, and every decision carries its term, so
a deposed leader's late decision is refused where it lands (`accepts`).

Why wait a lease TTL after the node is gone: a node cut off from the quorum halts its
consistent tasks within the TTL (core/leader.py's halt rule); re-placing a task, or moving
the repo, before then could let the old runner and the new one overlap.

Pure: `decide(view, now)` takes the leader's view and returns effects; the shell
(kovanex/agent/leaderwork.py) publishes them and the grantee / owner writes them by CAS.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from kovanex.core.leader import accepts
from kovanex.core.replication import Ownership, successor, takeover
from kovanex.core.takeover import NodeState, replica_tips

GONE = frozenset({"dead", "left"})


@dataclass(frozen=True)
class Held:
    """An absolute-consistency task's lease as its owner announced it."""

    repo: str
    task_id: str
    node: str
    epoch: int


@dataclass(frozen=True)
class LeaderView:
    """What the leader knows now.

    nodes:      the takeover decider's view (owners in `known`, members, acks, tips).
    leads:      we hold an unexpired lease (core.leader.leads): else nothing is decided.
    term:       our term: it goes on every grant.
    consistent: repos whose owner says they hold absolute-consistency tasks.
    held:       the live leases of absolute-consistency tasks.
    gone_since: member -> when we first saw it dead or left (our monotonic clock).
    ttl_s:      the lease TTL: how long a cut-off node may still run before it halts.
    granted:    repo -> the newest grant we issued (never issued twice).
    rescheduled: (repo, task) -> the epoch we already re-placed.
    """

    nodes: NodeState
    leads: bool
    term: int
    ttl_s: float
    consistent: frozenset[str] = frozenset()
    held: tuple[Held, ...] = ()
    gone_since: Mapping[str, float] = field(default_factory=dict)
    granted: Mapping[str, Ownership] = field(default_factory=dict)
    rescheduled: Mapping[tuple[str, str], int] = field(default_factory=dict)


@dataclass(frozen=True)
class Grant:
    """`new.owner` takes `repo` over from `old` at `term`: it writes the ownership record by
    CAS against `old` with a `Kovanex-Term` trailer, and refuses a term older than it knows."""

    repo: str
    old: Ownership
    new: Ownership
    term: int


@dataclass(frozen=True)
class Reschedule:
    """`owner` requeues `repo`/`task_id` held by `node` at `epoch` (CAS on the branch, a new
    epoch, `Kovanex-Term: term`); the next placement carries the term again."""

    repo: str
    task_id: str
    owner: str
    node: str
    epoch: int
    term: int


Effect = Grant | Reschedule


def expired(view: LeaderView, node: str, now: float) -> bool:
    """`node` has been gone for a lease TTL: if it was cut off, it has halted by now."""
    since = view.gone_since.get(node)
    return since is not None and now >= since + view.ttl_s


def decide(view: LeaderView, now: float) -> list[Effect]:
    """Grants first (a task's owner must live before its task can be re-placed)."""
    if not view.leads or view.term <= 0:
        return []
    return grants(view, now) + reschedules(view, now)


def grants(view: LeaderView, now: float) -> list[Grant]:
    """A consistent repo whose owner is gone for a TTL goes to the live replica holding the
    most of the owner's refs (the takeover rule's ranking), at epoch + 1, with our term."""
    out = []
    st = view.nodes
    live = {n for n, m in st.members.items() if m.status == "alive"} | {st.me}
    for repo in sorted(view.consistent):
        o = st.known.get(repo)
        if o is None or not expired(view, o.owner, now):
            continue
        prior = view.granted.get(repo)
        if prior is not None and prior.epoch > o.epoch:
            continue  # issued; waiting for the grantee to announce it
        heir = successor(o, live, replica_tips(st, repo, o), st.owner_tips.get(repo, {}))
        if heir is not None:
            out.append(Grant(repo, o, takeover(o, heir).new, view.term))
    return out


def reschedules(view: LeaderView, now: float) -> list[Reschedule]:
    """A consistent task held by a node gone for a TTL is requeued by its repo's (live)
    owner, once per epoch."""
    out = []
    st = view.nodes
    for h in sorted(view.held, key=lambda h: (h.repo, h.task_id)):
        o = st.known.get(h.repo)
        if o is None or o.owner in view.gone_since or not expired(view, h.node, now):
            continue  # the repo needs a live owner first (a grant)
        if view.rescheduled.get((h.repo, h.task_id), -1) >= h.epoch:
            continue
        out.append(Reschedule(h.repo, h.task_id, o.owner, h.node, h.epoch, view.term))
    return out


def admit(known_term: int, grant_term: int) -> str | None:
    """The grantee's and owner's check: None to carry out a decision, else why not."""
    if grant_term <= 0:
        return "the decision carries no leader term"
    if not accepts(known_term, grant_term):
        return f"leader term {grant_term} is older than the term {known_term} known here"
    return None


__all__ = [
    "GONE",
    "Effect",
    "Grant",
    "Held",
    "LeaderView",
    "Reschedule",
    "admit",
    "decide",
    "expired",
    "grants",
    "reschedules",
]
