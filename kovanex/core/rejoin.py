"""The ready rule after a heal: when a node that lost its NATS quorum may place
absolute-consistency work again (issue 12, ADR 0041).

Why a quorum is not enough: NATS routes come back within a second of a heal, but owner
records travel by gossip and reach a returning node only at the next push-pull (up to
`push_pull_interval` later). A deposed owner that trusted its quorum alone would place
consistent work under an ownership the leader already granted away. So a node that lost
the quorum (or never had it yet) first does a full state sync (push-pull) and places no
consistent work until peers that, with it, make a majority of the known members have
answered: a majority must include a node of the side that held the quorum, so the sync
brings every takeover that side made.

Pure: `step(gate, quorum, now)` says when to sync, `synced(...)` takes the answer,
`ready(gate, quorum)` is the gate. The shell (agent/coordination/backend.py) does the push-pull.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from kovanex.core.leader import quorum_of


@dataclass(frozen=True)
class Gate:
    """lost: the quorum was lost (or not had yet) since the last confirmed sync.
    asked: when the sync in flight was started (None: none in flight)."""

    lost: bool = True
    asked: float | None = None


def step(g: Gate, quorum: bool, now: float) -> tuple[Gate, bool]:
    """Feed the quorum as the lease decider sees it; True: start a state sync now."""
    if not quorum:
        return (g if g.lost and g.asked is None else Gate(lost=True)), False
    if g.lost and g.asked is None:
        return replace(g, asked=now), True
    return g, False


def synced(g: Gate, asked: float, replied: int, known: int) -> Gate:
    """The answer to the sync started at `asked`: `replied` peers answered, `known`
    members (us included, not those that left) count for the majority. A stale answer
    (the quorum was lost again meanwhile) changes nothing; too few answers: ask again."""
    if g.asked != asked:
        return g
    if replied + 1 >= quorum_of(max(known, 1)):
        return Gate(lost=False)
    return replace(g, asked=None)


def ready(g: Gate, quorum: bool) -> bool:
    """Consistent work may be placed (or a lease run for it) here."""
    return quorum and not g.lost


__all__ = ["Gate", "ready", "step", "synced"]
