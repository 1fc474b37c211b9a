"""Who owns a repo after a failure, when to demote, where replicas go: a pure decider.

Why pure: these are the decisions a partition test or a whole-cluster simulator must be
able to replay exactly, so they take everything as arguments — one node's view of the
cluster (`NodeState`), one `Event`, and `now` — and return effects (dataclasses) for the
shell (`kovanex.agent.replication.ownership` and friends) to execute: write the ownership record, start
a fetch, publish, set a timer. No I/O, no clock, no randomness (ties break on names).

The rules (ADR 0007, 0016):
- A lower ownership epoch than we know is ignored; if we are the owner we re-publish.
- Two owners at one epoch (a split takeover): the lower name keeps the repo.
- An owner that sees a higher epoch for its repo demotes itself and resyncs from the new
  owner; what the new owner lacks goes to `refs/kovanex/lost/<old epoch>/`.
- A replica takes over a repo whose owner is dead (never merely suspect: a suspect may
  refute) if it ranks first among live replicas by refs held (`successor`), at epoch + 1.
  After a member fails, the decision waits `settle_s` (a `Recheck` timer) so the last acks
  arrive and every replica ranks the same.
- The owner keeps `replicas_wanted` replicas on alive (or suspect) full/storage members
  (`choose_replicas`): deterministic, so every node computes the same set.

Stable API (the simulator drives it): `decide(state, event, now)`, the event and effect
dataclasses below, `NodeState`, `Member`, `Config`. The helpers `on_owner_announced`,
`on_member_changed`, `takeover_due`, `place` and `tick` are what `decide` dispatches to.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

from kovanex.core.replication import MemberView, Ownership, choose_replicas, successor, takeover

ALIVE = frozenset({"alive", "suspect"})  # a suspect keeps its replica slot and its repos
STATUSES = frozenset({"alive", "suspect", "dead", "left"})
SETTLE_S = 0.3


# -- state -------------------------------------------------------------------------------
@dataclass(frozen=True)
class Member:
    """One cluster member as gossip shows it."""

    name: str
    role: str = "full"
    status: str = "alive"

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"member status {self.status!r} must be one of {sorted(STATUSES)}")


@dataclass(frozen=True)
class Config:
    settle_s: float = SETTLE_S


@dataclass(frozen=True)
class NodeState:
    """What node `me` knows. `members` need not list `me` (we are always alive to us).

    known:      repo -> the ownership record we believe (gossip or our disk).
    held:       repo -> replica -> how many of the owner's announced tips it holds (acks).
    owner_tips: repo -> ref -> oid the owner last announced.
    copies:     repos we hold a local copy of.
    """

    me: str
    known: Mapping[str, Ownership] = field(default_factory=dict)
    members: Mapping[str, Member] = field(default_factory=dict)
    held: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    owner_tips: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    copies: frozenset[str] = frozenset()
    config: Config = Config()

    def status(self, name: str) -> str:
        if name == self.me:
            return "alive"
        m = self.members.get(name)
        return m.status if m is not None else "dead"

    def views(self) -> list[MemberView]:
        """Placement's view: suspects count as alive (no re-copy on a flap)."""
        out = [MemberView(m.name, m.role, m.status in ALIVE) for m in self.members.values()]
        if self.me not in self.members:
            out.append(MemberView(self.me, "full", True))
        return out


# -- events ------------------------------------------------------------------------------
@dataclass(frozen=True)
class OwnerAnnounced:
    """Gossip (or our start-up scan) says `ownership` holds for `repo`."""

    repo: str
    ownership: Ownership


@dataclass(frozen=True)
class MemberChanged:
    """Member `name` is now `status` (joined, updated, suspect, failed, left); `state`
    already reflects it."""

    name: str
    status: str
    joined: bool = False  # it came back from dead or left (or is new): gossip's member-join


@dataclass(frozen=True)
class TakeoverDue:
    """A `Recheck` timer fired: decide a takeover of `repo` now."""

    repo: str


@dataclass(frozen=True)
class Tick:
    """The periodic pass: takeovers missed by events, replica placement, missed copies."""


Event = OwnerAnnounced | MemberChanged | TakeoverDue | Tick


# -- effects -----------------------------------------------------------------------------
@dataclass(frozen=True)
class TakeOver:
    """Write `new` over `old` (CAS against the record on disk), promote sync-acked commits,
    then publish `new`. The shell re-checks its disk first and drops the effect if the disk
    knows a newer epoch."""

    repo: str
    old: Ownership
    new: Ownership


@dataclass(frozen=True)
class Demote:
    """We owned `repo` under `mine`; `theirs` supersedes it: become a follower of theirs."""

    repo: str
    mine: Ownership
    theirs: Ownership


@dataclass(frozen=True)
class Adopt:
    """Believe `ownership` for `repo`; `resync_from` (our previous upstream's epoch) asks
    the next fetch to keep what the new upstream lacks under lost/<epoch>/."""

    repo: str
    ownership: Ownership
    resync_from: int | None = None


@dataclass(frozen=True)
class FetchFrom:
    """Fetch `repo` from `from_node` (its owner). `create`: make the local copy first;
    `restart`: the upstream changed, so abandon a fetch in flight."""

    repo: str
    from_node: str
    create: bool = False
    restart: bool = False


@dataclass(frozen=True)
class StopFetching:
    """We are not (or no longer) a replica of `repo`: cancel a fetch in flight."""

    repo: str


@dataclass(frozen=True)
class PlaceReplicas:
    """Owner: write `new` (same owner and epoch, replicas changed) and publish it."""

    repo: str
    old: Ownership
    new: Ownership

    @property
    def replicas(self) -> tuple[str, ...]:
        return self.new.replicas


@dataclass(frozen=True)
class PublishOwner:
    """Re-announce our record (a stale or equal-epoch claim is out there)."""

    repo: str
    ownership: Ownership


@dataclass(frozen=True)
class Recheck:
    """Deliver `TakeoverDue(repo)` at `at` (seconds on the caller's clock)."""

    repo: str
    at: float


Effect = (
    TakeOver | Demote | Adopt | FetchFrom | StopFetching | PlaceReplicas | PublishOwner | Recheck
)


# -- decisions ---------------------------------------------------------------------------
def first_claim(node: str) -> Ownership:
    """The record a node writes for a repo it creates (or finds unclaimed on its disk):
    epoch 1, async, one replica wanted."""
    return Ownership(node, 1, (), "async", 1)


def decide(state: NodeState, event: Event, now: float) -> list[Effect]:
    """The one entry point: effects for `event` as seen by `state.me` at `now`."""
    if isinstance(event, OwnerAnnounced):
        return on_owner_announced(state, event.repo, event.ownership)
    if isinstance(event, MemberChanged):
        return on_member_changed(state, event.name, event.status, now, event.joined)
    if isinstance(event, TakeoverDue):
        return takeover_due(state, event.repo)
    if isinstance(event, Tick):
        return tick(state)
    raise TypeError(f"not a takeover event: {event!r}")


def on_owner_announced(state: NodeState, repo: str, ann: Ownership) -> list[Effect]:
    """Adopt, ignore, out-shout, or demote ourselves, per the module rules."""
    me = state.me
    known = state.known.get(repo)
    if known is not None and ann.epoch < known.epoch:
        return [PublishOwner(repo, known)] if known.owner == me else []
    if known is not None and ann.epoch == known.epoch and ann.owner != known.owner:
        # A split takeover: the lower name keeps the repo, on every node. A bystander that
        # heard the loser first must switch too, or live nodes disagree forever (the
        # simulator found it: KOVANEX_SEED=27 with --ownership decider).
        if known.owner == me and ann.owner < me:
            return [Demote(repo, known, ann), FetchFrom(repo, ann.owner, restart=True)]
        if known.owner == me:
            return [PublishOwner(repo, known)]
        if ann.owner > known.owner:
            return []
    if known is not None and known.owner == me and ann.owner != me:
        return [Demote(repo, known, ann), FetchFrom(repo, ann.owner, restart=True)]
    if ann.owner == me:
        return []  # our own record echoed back by a peer that saw it
    moved = known is not None and (ann.epoch > known.epoch or ann.owner != known.owner)
    has_copy = repo in state.copies
    resync = known.epoch if (moved and has_copy and known is not None) else None
    out: list[Effect] = [Adopt(repo, ann, resync)]
    if me not in ann.replicas:
        out.append(StopFetching(repo))
    else:
        out.append(FetchFrom(repo, ann.owner, create=not has_copy, restart=moved))
    return out


def on_member_changed(
    state: NodeState, name: str, status: str, now: float, joined: bool = False
) -> list[Effect]:
    """A failed or departed owner: schedule a takeover check after `settle_s`. Any
    membership change: re-place the replicas of repos we own. A member that joins again
    (back from dead: a heal, a restart) gets our owner records afresh: it may have missed
    a takeover while cut off, whose broadcast spent its retransmits meanwhile, and a
    deposed owner that never saw anyone dead would believe it owns the repo until the
    next push-pull (issue 25 bug 3, KOVANEX_SEED=10)."""
    if name == state.me:
        return []
    out: list[Effect] = []
    if joined and status in ALIVE:
        out += [PublishOwner(r, o) for r, o in sorted(state.known.items()) if o.owner == state.me]
    if status in ("dead", "left"):
        for repo, o in sorted(state.known.items()):
            if o.owner == name and state.me in o.replicas:
                out.append(Recheck(repo, now + state.config.settle_s))
    for repo, o in sorted(state.known.items()):
        if o.owner == state.me:
            out += place(state, repo)
    return out


def takeover_due(state: NodeState, repo: str) -> list[Effect]:
    """Take `repo` over if its owner is dead and we rank first among live replicas."""
    o = state.known.get(repo)
    if o is None or o.owner == state.me or state.me not in o.replicas:
        return []
    if state.status(o.owner) in ALIVE:
        return []  # a suspect owner may still refute: never depose it early
    live = {n for n, m in state.members.items() if m.status == "alive"} | {state.me}
    if successor(o, live, replica_tips(state, repo, o), state.owner_tips.get(repo, {})) != state.me:
        return []
    return [TakeOver(repo, o, takeover(o, state.me).new)]


def replica_tips(state: NodeState, repo: str, o: Ownership) -> dict[str, dict[str, str]]:
    """Acks carry counts, `successor` wants tips: a replica holding k tips is credited with
    the first k in a fixed order, which ranks replicas by count as intended."""
    order = sorted(state.owner_tips.get(repo, {}).items())
    held = state.held.get(repo, {})
    return {n: dict(order[: max(0, int(held.get(n, 0)))]) for n in o.replicas}


def place(state: NodeState, repo: str) -> list[Effect]:
    """Owner side: the replica set `choose_replicas` gives, if it differs from the record."""
    o = state.known.get(repo)
    if o is None or o.owner != state.me:
        return []
    wanted = o.replicas_wanted if o.level != "none" else 0
    chosen = tuple(choose_replicas(state.me, state.views(), wanted, o.replicas, salt=repo))
    if chosen == o.replicas:
        return []
    return [PlaceReplicas(repo, o, replace(o, replicas=chosen))]


def contested(state: NodeState, claims: Mapping[str, Iterable[str]]) -> list[Effect]:
    """Repos we own that another live member still lists as its own (`claims`: member ->
    the repos its inventory, gossip topic `repos`, says it owns). It missed our record: the
    takeover's broadcast spent its retransmits while it was cut off, or gossip, last writer
    wins by version, kept its own stale record, written later on its clock. Announce ours
    again each pass until it demotes: every write carries a newer version than any we have
    seen, so once its values reach us ours win (issue 25 bug 3, KOVANEX_SEED=10)."""
    mine = [(r, o) for r, o in sorted(state.known.items()) if o.owner == state.me]
    if not mine:
        return []
    rivals = [
        set(repos)
        for n, repos in sorted(claims.items())
        if n != state.me and state.status(n) == "alive"
    ]
    return [PublishOwner(r, o) for r, o in mine if any(r in c for c in rivals)]


def tick(state: NodeState) -> list[Effect]:
    """Per repo: owned -> placement; replicated with a dead owner -> takeover check;
    replicated with no local copy yet -> create and fetch."""
    out: list[Effect] = []
    for repo, o in sorted(state.known.items()):
        if o.owner == state.me:
            out += place(state, repo)
        elif state.me in o.replicas:
            if state.status(o.owner) not in ALIVE:
                out += takeover_due(state, repo)
            elif repo not in state.copies:
                out.append(FetchFrom(repo, o.owner, create=True))
    return out


__all__ = [
    "ALIVE",
    "Adopt",
    "Config",
    "Demote",
    "Effect",
    "Event",
    "FetchFrom",
    "Member",
    "MemberChanged",
    "NodeState",
    "OwnerAnnounced",
    "PlaceReplicas",
    "PublishOwner",
    "Recheck",
    "StopFetching",
    "TakeOver",
    "TakeoverDue",
    "Tick",
    "decide",
    "first_claim",
    "on_member_changed",
    "on_owner_announced",
    "place",
    "replica_tips",
    "takeover_due",
    "contested",
    "tick",
]
