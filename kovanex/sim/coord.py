"""The coordination backend in the simulator: NATS JetStream KV as a linearizable register.

Why this shape (ADR 0029): Kovanex does not implement consensus, it uses JetStream's; what
the leader decider relies on is only the register's contract, so that is what is modelled:
- one revision counter shared by every key (the stream sequence): it only grows;
- `create` (absent only), `update(last=rev)` (that key's revision only; `last=0`: absent)
  and `put`, each applied atomically at one instant (its linearization point);
- reachable only from a side of the partition that holds a quorum (n/2 + 1) of the live
  servers (a NATS server runs on every simulated node): a minority gets "no responders"
  at once, and a request whose reply is cut off times out (the write may have landed);
- the stream has a leader server; when it crashes or is cut off from the quorum, writes
  fail for a re-election of 4.7-10.5 s (measured here, issue 12) - longer than the lease
  TTL on purpose, the case ADR 0027's key-without-TTL exists for;
- the store fences: a write that carries a term (a grant, a job's state) is refused when
  an older term than the leader key's (`core.leader.accepts`).
The register only models what the real cluster would answer; the simulated nodes reach
it through `World` timing with their own seeded delays (never the sim network's RNG, so
the git/gossip part of every seed replays exactly as before the lease was modelled).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kovanex.core.leader import accepts, quorum_of

if TYPE_CHECKING:
    from kovanex.sim.world import World

LEADER_KEY = "leader"
REPLY_TIMEOUT = 2.0  # the shell's request timeout: a lost reply is "unavailable"
ELECTION = (4.7, 10.5)  # stream-leader re-election, seconds (issue 12's measurement)


@dataclass(frozen=True)
class Answer:
    """One operation's result. ok: `rev` is the write's revision. Refused: `rev`/`value`
    are the key's current ones (rev 0, value None: absent). `unavailable`: no quorum, a
    stream-leader election, or a reply that never came back. `fenced`: an older term."""

    ok: bool
    rev: int = 0
    value: Any = None
    unavailable: bool = False
    fenced: bool = False


class Register:
    """The KV bucket: key -> (revision, value), one growing revision counter."""

    def __init__(self) -> None:
        self.seq = 0
        self.keys: dict[str, tuple[int, Any]] = {}
        self.term = 0  # the leader key's term: the fencing floor of term-carrying writes
        # checker inputs: every accepted term-carrying write (key, term, floor at the time)
        self.accepted: list[tuple[str, int, int, float]] = []

    def _write(self, key: str, value: Any) -> Answer:
        self.seq += 1
        self.keys[key] = (self.seq, value)
        if key == LEADER_KEY:
            self.term = max(self.term, getattr(value, "term", 0) or self.seq)
        return Answer(True, self.seq, value)

    def get(self, key: str) -> tuple[int, Any]:
        return self.keys.get(key, (0, None))

    def apply(
        self, op: str, key: str, value: Any, last: int, term: int | None, now: float
    ) -> Answer:
        """One operation at its linearization point."""
        if term is not None and not accepts(self.term, term):
            return Answer(False, *self.get(key), fenced=True)
        rev, cur = self.get(key)
        if op == "create" or (op == "update" and last == 0):
            if rev:
                return Answer(False, rev, cur)
        elif op == "update" and rev != last:
            return Answer(False, rev, cur)
        ans = self._write(key, value)
        if term is not None:
            self.accepted.append((key, term, self.term, now))
        return ans


class Backend:
    """The register as the simulated nodes reach it (see the module doc)."""

    def __init__(self, w: World, seed: int) -> None:
        self.w = w
        self.reg = Register()
        self.rng = random.Random(seed ^ 0xC0DE)
        names = sorted(w.agents)
        self.stream_leader = names[self.rng.randrange(len(names))]
        self.down_until = 0.0  # a stream-leader election in progress
        self.elections = 0
        self.watchers: list[Callable[[int, Any], None]] = []  # leader-key watch, per node

    def quorum_side(self, name: str) -> list[str]:
        """The live servers `name` reaches, if they are a quorum of all; else []."""
        w = self.w
        if not w.agents[name].up:
            return []
        side = [n for n, a in w.agents.items() if a.up and w.net.reachable(name, n)]
        return side if len(side) >= quorum_of(len(w.agents)) else []

    def available(self, name: str) -> bool:
        side = self.quorum_side(name)
        if not side:
            return False
        now = self.w.now
        if self.stream_leader not in side and now >= self.down_until:
            # the stream's leader crashed or is cut off: the quorum side elects another
            self.stream_leader = side[self.rng.randrange(len(side))]
            self.down_until = now + self.rng.uniform(*ELECTION)
            self.elections += 1
            self.w.note(
                f"coord: stream leader now {self.stream_leader}, writes back at "
                f"t={self.down_until:.1f}"
            )
        return now >= self.down_until

    def delay(self) -> float:
        return self.rng.uniform(0.002, 0.02)

    def request(
        self,
        name: str,
        op: str,
        key: str,
        value: Any,
        reply: Callable[[Answer], None],
        *,
        last: int = 0,
        term: int | None = None,
        hold: float = 0.0,
    ) -> None:
        """Send one operation from node `name`; `reply` gets exactly one Answer (on this
        incarnation of the node). `hold`: the request sits that long before it leaves
        (a process pause between deciding and sending: what term fencing is for)."""
        agent = self.w.agents[name]
        gen = agent.gen
        done = [False]

        def finish(ans: Answer) -> None:
            if done[0] or not agent.up or agent.gen != gen:
                return
            done[0] = True
            reply(ans)

        sent = self.w.now + hold

        def arrive() -> None:
            if not self.available(name):  # "no responders": at once
                self.w.later(self.delay(), finish, Answer(False, unavailable=True))
                return
            ans = self.reg.apply(op, key, value, last, term, self.w.now)
            if ans.ok and key == LEADER_KEY:
                self._notify(ans.rev, value)
            self.w.later(self.delay(), deliver, ans)

        def deliver(ans: Answer) -> None:
            if self.quorum_side(name):
                finish(ans)
            else:  # the reply was cut off: the caller times out (the write may have landed)
                self.w.at(sent + REPLY_TIMEOUT, finish, Answer(False, unavailable=True))

        self.w.later(hold + self.delay(), arrive)

    def _notify(self, rev: int, value: Any) -> None:
        """The leader key's watch: nodes on the quorum side hear of each write."""
        for watch in self.watchers:
            self.w.later(self.delay(), watch, rev, value)


__all__ = ["ELECTION", "LEADER_KEY", "REPLY_TIMEOUT", "Answer", "Backend", "Register"]
