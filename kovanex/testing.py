"""Builders for fast in-process tests (shipped like trio.testing): a fake clock, ownership
records and node views for the takeover decider; more are added as the deciders need them."""

from __future__ import annotations

from kovanex.core.replication import Ownership
from kovanex.core.takeover import Config, Member, NodeState


class FakeClock:
    """A `kovanex.clock.Clock` that only moves when a test says so."""

    def __init__(self, wall: float = 1_700_000_000.0, mono: float = 1000.0) -> None:
        self._wall = wall
        self._mono = mono

    def time(self) -> float:
        return self._wall

    def monotonic(self) -> float:
        return self._mono

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("a clock never goes back")
        self._wall += seconds
        self._mono += seconds


# -- replication / takeover builders (kovanex.core.takeover) --------------------------------
def ownership(
    owner: str = "n1",
    epoch: int = 1,
    replicas: tuple[str, ...] | list[str] | str = (),
    level: str = "async",
    wanted: int | None = None,
) -> Ownership:
    """An ownership record; `replicas` may be "n2,n3"; `wanted` defaults to len(replicas)."""
    reps = (
        tuple(r for r in replicas.split(",") if r) if isinstance(replicas, str) else tuple(replicas)
    )
    want = len(reps) if wanted is None else wanted
    return Ownership(owner, epoch, reps, "none" if level == "none" else level, want)


def member_views(spec: str = "", **statuses: str) -> dict[str, Member]:
    """Members by name from "n1 n2 n3:storage n4:runner"; keyword args set statuses
    (member_views("n1 n2 n3", n1="dead"))."""
    out: dict[str, Member] = {}
    for item in spec.split():
        name, _, role = item.partition(":")
        out[name] = Member(name, role or "full", statuses.get(name, "alive"))
    for name, status in statuses.items():
        if name not in out:
            out[name] = Member(name, "full", status)
    return out


def node_state(
    me: str,
    members: str | dict[str, Member] = "",
    *,
    known: dict[str, Ownership] | None = None,
    held: dict[str, dict[str, int]] | None = None,
    owner_tips: dict[str, dict[str, str]] | None = None,
    copies: tuple[str, ...] | list[str] | None = None,
    settle_s: float = 0.3,
) -> NodeState:
    """A `NodeState` for `me`; copies default to every repo we own or replicate."""
    mem = member_views(members) if isinstance(members, str) else members
    kn = dict(known or {})
    if copies is None:
        copies = [r for r, o in kn.items() if o.owner == me or me in o.replicas]
    return NodeState(
        me=me,
        known=kn,
        members=mem,
        held=held or {},
        owner_tips=owner_tips or {},
        copies=frozenset(copies),
        config=Config(settle_s=settle_s),
    )
