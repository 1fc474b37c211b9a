"""Repo ownership and replication decisions, as a pure core.

One node owns a repo and takes its writes; replicas are read-only mirrors fed by ref
announcements (Radicle's model: announce, compute want/have, fetch into staging, verify,
apply) plus anti-entropy. `sync` acknowledges a write only once `replicas_wanted` replicas
hold it (Radicle's `MustReach(n)`, Praefect's vote). Everything here is a function of its
arguments: the shell supplies membership views, ref tips and `now`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

LEVELS = ("none", "async", "sync")
REPLICA_ROLES = frozenset({"full", "storage"})  # runners and servers keep no durable copies
META_REF = "refs/kovanex/meta"


@dataclass(frozen=True)
class ReplicationPolicy:
    level: str = "none"
    replicas_wanted: int = 0

    def __post_init__(self) -> None:
        if self.level not in LEVELS:
            raise ValueError(f"replication level {self.level!r} must be one of {LEVELS}")
        if self.replicas_wanted < 0:
            raise ValueError("replicas_wanted must be >= 0")
        if self.level == "none" and self.replicas_wanted:
            raise ValueError("level 'none' keeps no replicas; use 'async' or 'sync'")


@dataclass(frozen=True)
class Ownership:
    """Who takes a repo's writes; `epoch` fences a deposed owner out (as task epochs do)."""

    owner: str
    epoch: int
    replicas: tuple[str, ...] = ()
    level: str = "none"
    replicas_wanted: int = 0

    def __post_init__(self) -> None:
        if not self.owner:
            raise ValueError("ownership needs an owner")
        if self.epoch < 1:
            raise ValueError("ownership epochs start at 1")
        if self.owner in self.replicas:
            raise ValueError(f"{self.owner} cannot replicate its own repo")
        if len(set(self.replicas)) != len(self.replicas):
            raise ValueError(f"duplicate replicas in {self.replicas}")
        ReplicationPolicy(self.level, self.replicas_wanted)  # validates

    @property
    def policy(self) -> ReplicationPolicy:
        return ReplicationPolicy(self.level, self.replicas_wanted)


@dataclass(frozen=True)
class MemberView:
    """What replication needs to know about a cluster member."""

    name: str
    role: str = "full"
    alive: bool = True


@dataclass(frozen=True)
class RefAnnouncement:
    """The owner says: `ref` of `repo` is at `oid` (task lease `epoch`), under ownership
    `owner`/`owner_epoch`."""

    repo: str
    ref: str
    oid: str
    epoch: int
    owner: str
    owner_epoch: int


@dataclass(frozen=True)
class Fetch:
    """Effect: fetch these refs of `repo` from its owner into staging, then apply."""

    repo: str
    refs: tuple[str, ...]


@dataclass(frozen=True)
class Lag:
    refs_behind: int
    seconds_behind: float


@dataclass(frozen=True)
class Takeover:
    """Decision: `new` replaces a dead owner; write it with the old ownership as expected."""

    old: Ownership
    new: Ownership


def _rank(name: str, salt: str) -> tuple[str, str]:
    # With a salt (the repo name) this is rendezvous hashing: each repo gets its own order,
    # so replicas spread over the cluster instead of piling on the alphabetically first nodes.
    if not salt:
        return ("", name)
    return (hashlib.sha256(f"{salt}\0{name}".encode()).hexdigest(), name)


def choose_replicas(
    owner: str,
    members: Iterable[MemberView],
    wanted: int,
    current: Iterable[str] = (),
    *,
    salt: str = "",
) -> list[str]:
    """Replica set for a repo: keep healthy current replicas (no needless re-copies), fill up
    with alive FULL/STORAGE members; deterministic, so every node computes the same answer.
    Returned sorted by name."""
    eligible = {m.name for m in members if m.alive and m.role in REPLICA_ROLES and m.name != owner}
    keep = sorted({c for c in current if c in eligible}, key=lambda n: _rank(n, salt))[:wanted]
    fill = sorted(eligible - set(keep), key=lambda n: _rank(n, salt))
    return sorted(keep + fill[: max(0, wanted - len(keep))])


def on_announcement(
    local_refs: Mapping[str, str],
    ann: RefAnnouncement,
    known: Ownership | None = None,
) -> list[Fetch]:
    """Fetch only what we lack; ignore a deposed owner. A newer ownership epoch than we know
    also pulls the meta ref, so we learn who the owner is now."""
    if known is not None:
        if ann.owner_epoch < known.epoch:
            return []
        if ann.owner_epoch == known.epoch and ann.owner != known.owner:
            return []  # two owners claiming one epoch: trust neither until meta says
    refs: list[str] = []
    if local_refs.get(ann.ref) != ann.oid:
        refs.append(ann.ref)
    if known is None or ann.owner_epoch > known.epoch:
        if ann.ref != META_REF:
            refs.append(META_REF)
    return [Fetch(ann.repo, tuple(refs))] if refs else []


def merge_fetches(fetches: Iterable[Fetch]) -> list[Fetch]:
    """One fetch per repo for a burst of announcements (one negotiation, one pack)."""
    by_repo: dict[str, dict[str, None]] = {}
    for f in fetches:
        by_repo.setdefault(f.repo, {}).update(dict.fromkeys(f.refs))
    return [Fetch(repo, tuple(refs)) for repo, refs in sorted(by_repo.items()) if refs]


def lag(
    local_refs: Mapping[str, str],
    owner_refs: Mapping[str, str],
    owner_times: Mapping[str, float],
    now: float,
) -> Lag:
    """How far a replica trails its owner: refs that differ, and the age of the oldest
    owner write we do not hold (our RPO right now). A ref with no known time counts in
    `refs_behind` only."""
    behind = [r for r, oid in owner_refs.items() if local_refs.get(r) != oid]
    ages = [max(0.0, now - owner_times[r]) for r in behind if r in owner_times]
    return Lag(len(behind), max(ages, default=0.0))


def successor(
    ownership: Ownership,
    live_members: Iterable[str],
    replica_tips: Mapping[str, Mapping[str, str]],
    owner_tips: Mapping[str, str] | None = None,
) -> str | None:
    """Who takes over a repo whose owner is dead: None while the owner lives or no replica
    does. Among live replicas, the one holding most refs equal to the last-known owner tips
    wins (without owner tips: the one holding most refs), then the lowest name."""
    live = set(live_members)
    if ownership.owner in live:
        return None
    candidates = [r for r in ownership.replicas if r in live]
    if not candidates:
        return None

    def score(name: str) -> int:
        tips = replica_tips.get(name, {})
        if owner_tips is None:
            return len(tips)
        return sum(1 for ref, oid in owner_tips.items() if tips.get(ref) == oid)

    return min(candidates, key=lambda n: (-score(n), n))


def takeover(ownership: Ownership, new_owner: str) -> Takeover:
    """The ownership record after `new_owner` replaces the dead owner: epoch + 1, and the
    new owner leaves the replica set (the shell re-fills it with `choose_replicas`)."""
    if new_owner == ownership.owner:
        raise ValueError("a takeover needs a different owner")
    replicas = tuple(r for r in ownership.replicas if r != new_owner)
    new = replace(ownership, owner=new_owner, epoch=ownership.epoch + 1, replicas=replicas)
    return Takeover(ownership, new)


def sync_quorum_ok(acks: Iterable[str], wanted: int) -> bool:
    """A `sync` write is acknowledged once `wanted` distinct replicas hold its refs."""
    return len(set(acks)) >= wanted
