"""The member table of one SWIM node: who it knows, in which state, and tombstones.

Split from the membership core so the bookkeeping that every rule leans on (the live
count that sizes suspicion and retransmits, the dead set reconnect draws from, the name
list that makes a random pick O(1), the round-robin probe order) has one owner and
stays consistent whatever rule changes a member's status.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kovanex.core.effects import Addr
from kovanex.core.gossip_msgs import ALIVE, DEAD, LEFT, SUSPECT, MemberState
from kovanex.core.rng import Rng
from kovanex.core.suspicion import Suspicion


@dataclass(slots=True)
class Member:
    name: str
    addr: Addr
    incarnation: int
    status: str
    meta: dict[str, Any]
    changed: float = 0.0
    suspicion: Suspicion | None = None

    def state(self) -> MemberState:
        return MemberState(self.name, self.addr, self.incarnation, self.status, self.meta)


class MemberTable:
    """Every member this node knows (itself included) and the removed ones' tombstones."""

    def __init__(self, me: Member, rng: Rng, gossip_to_the_dead: float) -> None:
        self.me = me
        self.rng = rng
        self.gossip_to_the_dead = gossip_to_the_dead
        self.members: dict[str, Member] = {me.name: me}
        self.names: list[str] = []  # every member but me, for O(1) random picks
        self.live = 1
        self.dead: set[str] = set()  # names currently DEAD (reconnect candidates)
        self.tombstones: dict[str, tuple[int, float, str]] = {}  # name -> (inc, since, status)
        self._order: list[str] = []
        self._order_i = 0

    def get(self, name: str) -> Member | None:
        return self.members.get(name)

    def add(self, m: Member) -> None:
        self.members[m.name] = m
        self.names.append(m.name)
        if m.status in (ALIVE, SUSPECT):
            self.live += 1
        elif m.status == DEAD:
            self.dead.add(m.name)

    def remove(self, name: str) -> None:
        m = self.members.pop(name)
        self.dead.discard(name)
        if m.status in (ALIVE, SUSPECT):
            self.live -= 1
        i = self.names.index(name)
        self.names[i] = self.names[-1]
        self.names.pop()

    def preload(self, now: float, states: list[MemberState]) -> None:
        """Install known members without gossip or events (simulator bootstrap)."""
        members, names = self.members, self.names
        for s in states:
            if s.name not in members:
                members[s.name] = Member(s.name, s.addr, s.incarnation, s.status, s.meta, now)
                names.append(s.name)
                self.live += s.status in (ALIVE, SUSPECT)
                if s.status == DEAD:
                    self.dead.add(s.name)

    def set_status(self, m: Member, status: str, now: float) -> None:
        was_live = m.status in (ALIVE, SUSPECT)
        is_live = status in (ALIVE, SUSPECT)
        self.live += is_live - was_live
        m.status = status
        m.changed = now
        if status == DEAD:
            self.dead.add(m.name)
        else:
            self.dead.discard(m.name)
        if status != SUSPECT:
            m.suspicion = None

    def pick(self, k: int, live_only: bool, now: float = 0.0, exclude: str = "") -> list[Member]:
        """Up to k distinct random members other than me (rejection sampling, O(k))."""
        names = self.names
        if not names or k <= 0:
            return []
        out: dict[str, Member] = {}
        tries = 0
        while len(out) < k and tries < 4 * k + 8:
            tries += 1
            m = self.members[names[self.rng.randrange(len(names))]]
            if m.name in out or m.name == exclude:
                continue
            if m.status in (ALIVE, SUSPECT) or (
                not live_only and m.status == DEAD and now - m.changed < self.gossip_to_the_dead
            ):
                out[m.name] = m
        return list(out.values())

    def next_target(self) -> Member | None:
        """The next live member in a shuffled round-robin: SWIM's bounded detection time."""
        for _ in range(2):
            while self._order_i < len(self._order):
                m = self.members.get(self._order[self._order_i])
                self._order_i += 1
                if m is not None and m.status in (ALIVE, SUSPECT):
                    return m
            self._order = list(self.names)
            self.rng.shuffle(self._order)
            self._order_i = 0
        return None

    def states(self) -> list[MemberState]:
        """Every member and every tombstone, as a push-pull carries them."""
        states = [m.state() for m in self.members.values()]
        states += [MemberState(n, ("", 0), i, st, {}) for n, (i, _, st) in self.tombstones.items()]
        return states

    def reap(self, now: float, dead_reap: float, left_reap: float, ttl: float) -> None:
        """Drop members dead or left long enough (a tombstone keeps their incarnation so a
        stale state cannot revive them), then the tombstones older than `ttl`."""
        for m in list(self.members.values()):
            if m.name == self.me.name:
                continue
            age = now - m.changed
            if (m.status == DEAD and age >= dead_reap) or (m.status == LEFT and age >= left_reap):
                self.remove(m.name)
                self.tombstones[m.name] = (m.incarnation, now, m.status)
        for n, (_, since, _) in list(self.tombstones.items()):
            if now - since >= ttl:
                del self.tombstones[n]
