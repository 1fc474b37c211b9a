"""The leader's memory of its decisions, and when one is issued again (ADR 0036; issue 25
part 5, ADR 0091). agent/leaderwork.py is the shell; core/grants.py makes the decisions.

Why a memory: a grant or a reschedule travels on gossip and counts once its grantee or
owner writes it by CAS. Issued every pass, it would be re-published each period and
carried out twice if the first CAS is slow; so the leader remembers what it issued and
core/grants.py skips it. Why forget: a decision nobody carried out (the grantee died, the
gossip value was lost, the owner refused it as stale meanwhile) must not block the repo or
the task for good, so a remembered decision lapses after `reissue_after_s` (REISSUE_TTLS
lease TTLs) and is issued again. And why `gone_since`: the TTL before a gone node's
repos and tasks move counts from when this leader first saw it dead or left.

Shape: `decide(state, event, now) -> (state, effects)` (core/decider.py). `MembersSeen`
each pass; `Pass` with the leader's view (its memory fields are filled in here).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from kovanex.core import grants
from kovanex.core.replication import Ownership

Key = tuple[str, str]  # (repo, task_id)
REISSUE_TTLS = 4  # a decision nobody carried out is issued again after this many TTLs


@dataclass(frozen=True)
class GrantMemory:
    """gone_since: member -> when first seen dead or left; granted: repo -> (the record
    granted, when); rescheduled: task -> (the epoch re-placed, when)."""

    reissue_after_s: float
    gone_since: Mapping[str, float] = field(default_factory=dict)
    granted: Mapping[str, tuple[Ownership, float]] = field(default_factory=dict)
    rescheduled: Mapping[Key, tuple[int, float]] = field(default_factory=dict)


def memory(ttl_s: float) -> GrantMemory:
    return GrantMemory(REISSUE_TTLS * ttl_s)


@dataclass(frozen=True)
class MembersSeen:
    """Members' statuses as gossip shows them now (a member not listed is left as it was)."""

    statuses: Mapping[str, str]


@dataclass(frozen=True)
class Pass:
    """A leader pass over `view` (its gone_since/granted/rescheduled are ignored)."""

    view: grants.LeaderView


Event = MembersSeen | Pass


def decide(s: GrantMemory, ev: Event, now: float) -> tuple[GrantMemory, list[grants.Effect]]:
    if isinstance(ev, MembersSeen):
        gone = dict(s.gone_since)
        for name, status in ev.statuses.items():
            if status in grants.GONE:
                gone.setdefault(name, now)
            else:
                gone.pop(name, None)
        return replace(s, gone_since=gone), []
    stale = now - s.reissue_after_s
    granted = {r: g for r, g in s.granted.items() if g[1] > stale}  # lapsed: forgotten
    rescheduled = {k: r for k, r in s.rescheduled.items() if r[1] > stale}
    view = replace(
        ev.view,
        gone_since=dict(s.gone_since),
        granted={r: o for r, (o, _at) in granted.items()},
        rescheduled={k: e for k, (e, _at) in rescheduled.items()},
    )
    out = grants.decide(view, now)
    for e in out:
        if isinstance(e, grants.Grant):
            granted[e.repo] = (e.new, now)
        else:
            rescheduled[(e.repo, e.task_id)] = (e.epoch, now)
    return replace(s, granted=granted, rescheduled=rescheduled), out
