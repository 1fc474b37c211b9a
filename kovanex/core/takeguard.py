"""The re-checks a takeover makes under the repo's lock, before it writes the ownership
record (ADR 0016, 0036; issue 25 part 5, ADR 0091). agent/replication/ownership.py is the shell.

Why re-check: the decision to take a repo over (the gossip takeover rule, core/takeover.py,
or the leader's grant, core/grants.py) was made on a view taken before the lock. Between
the two, gossip may have moved on (another replica took over, the owner came back), or our
own disk may already hold a newer record than the one the decision named. Writing then
would start a second owner; so:
- a grant is for us, and we hold a copy of the repo;
- the record we know is still the one the decision replaced (`old`): for a grant its
  (owner, epoch); for the gossip rule the whole record;
- our disk's record is not newer than `old`, and does not already name us.
Then the record is written by CAS against what the disk holds, with the grant's term.

Shape: `decide(state, event, now) -> (state, effects)` (core/decider.py); it keeps no
memory between events (`GuardState` only names the node).
"""

from __future__ import annotations

from dataclasses import dataclass

from kovanex.core.replication import Ownership


@dataclass(frozen=True)
class GuardState:
    me: str


@dataclass(frozen=True)
class Locked:
    """We hold the repo's lock to take it over from `old` to `new`. `term`: the leader's
    grant term (None: the gossip rule); `known`: the record we know now; `has_copy`: the
    repo is on our disk."""

    repo: str
    old: Ownership
    new: Ownership
    term: int | None
    known: Ownership | None
    has_copy: bool = True


@dataclass(frozen=True)
class DiskRead:
    """Our disk's ownership record of `repo` (None: none), read under the lock."""

    repo: str
    old: Ownership
    new: Ownership
    term: int | None
    local: Ownership | None


Event = Locked | DiskRead


@dataclass(frozen=True)
class ReadDisk:
    """Read our disk's record, then feed `DiskRead`."""

    repo: str


@dataclass(frozen=True)
class WriteRecord:
    """Write `new` by CAS against `expected` (the disk's record), with `term` if granted."""

    repo: str
    new: Ownership
    expected: Ownership | None
    term: int | None


@dataclass(frozen=True)
class Refuse:
    """Do not take it over: the view the decision was made on is gone."""

    repo: str
    why: str


Effect = ReadDisk | WriteRecord | Refuse


def decide(s: GuardState, ev: Event, now: float) -> tuple[GuardState, list[Effect]]:
    if isinstance(ev, Locked):
        return s, [_locked(s, ev)]
    local = ev.local
    if local is not None and (local.epoch > ev.old.epoch or local.owner == s.me):
        why = f"our disk knows better (owner {local.owner}, epoch {local.epoch})"
        return s, [Refuse(ev.repo, why)]
    return s, [WriteRecord(ev.repo, ev.new, local, ev.term)]


def _locked(s: GuardState, ev: Locked) -> Effect:
    known = ev.known
    if ev.term is None:
        if known != ev.old:
            return Refuse(ev.repo, "gossip moved on since the decider looked")
        return ReadDisk(ev.repo)
    if ev.new.owner != s.me or not ev.has_copy:
        return Refuse(ev.repo, "the grant is not for us, or we hold no copy")
    if known is not None and (known.epoch, known.owner) != (ev.old.epoch, ev.old.owner):
        return Refuse(ev.repo, "the record moved since the leader decided")
    return ReadDisk(ev.repo)
