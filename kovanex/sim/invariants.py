"""Invariant checkers for simulated gossip clusters.

Each returns a list of human-readable violations (empty = holds), so a test can
assert `== []` and a failing seed prints exactly what went wrong.
"""

from __future__ import annotations

from kovanex.core.effects import Publish
from kovanex.core.gossip_msgs import ALIVE, DEAD, LEFT
from kovanex.sim.cluster import SimCluster, SimNode


def converged(c: SimCluster) -> list[str]:
    """Every live node sees exactly the live nodes as alive, with the same incarnations."""
    up = c.up_nodes()
    truth = {n.name: n.core.me.incarnation for n in up}
    bad = []
    for n in up:
        seen = {m.name: m.incarnation for m in n.core.members.values() if m.status == ALIVE}
        if seen != truth:
            missing = sorted(set(truth) - set(seen))[:5]
            extra = sorted(set(seen) - set(truth))[:5]
            stale = sorted(k for k in truth if k in seen and seen[k] != truth[k])[:5]
            bad.append(f"{n.name}: missing {missing} extra {extra} stale incarnation {stale}")
    return bad


def dead_everywhere(c: SimCluster, name: str) -> list[str]:
    """`name` is dead/left (or already reaped) on every live node."""
    bad = []
    for n in c.up_nodes():
        m = n.core.members.get(name)
        if m is not None and m.status not in (DEAD, LEFT):
            bad.append(f"{n.name} sees {name} as {m.status}")
    return bad


class FalseDeathRecorder:
    """Counts member-failed events about nodes that never crashed."""

    def __init__(self, c: SimCluster) -> None:
        self.c = c
        self.events: list[tuple[float, str, str]] = []
        c.on_publish.append(self._on)

    def _on(self, node: SimNode, e: Publish) -> None:
        if e.topic == "member-failed":
            victim = self.c.nodes.get(e.payload.name)
            if victim is not None and victim.up:
                self.events.append((self.c.loop.now, node.name, e.payload.name))
