"""SWIM's failure detector with Lifeguard's local health (memberlist state.go probe).

One probe per period: a direct ping, then ping-reqs through `indirect_checks` helpers
when the ack is late; a helper relays the ping and nacks in time if the target stays
silent, so a prober whose helpers all nacked blames the target, not its own health.
The prober judges its probe at the start of the next period and names the member to
suspect; the membership core owns what a suspicion does. It returns messages, never
sends: the core adds the piggybacked gossip.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kovanex.core.awareness import Awareness, nack_delta
from kovanex.core.deadlines import Deadlines
from kovanex.core.effects import Addr
from kovanex.core.gossip_msgs import ALIVE, SUSPECT, Ack, Msg, Nack, Ping, PingReq, Suspect
from kovanex.core.gossip_profiles import Profile
from kovanex.core.member_table import Member, MemberTable

Out = tuple[Addr, list[Msg]]  # messages for one address, gossip still to ride along


@dataclass(slots=True)
class Counters:
    """What the core did, for stats and the benches."""

    probes: int = 0
    failed_probes: int = 0
    suspects_started: int = 0
    deaths_declared: int = 0
    refutes: int = 0
    late_probes: int = 0  # probes left unjudged: this node ran too late to read their ack
    sent: dict[str, int] = field(default_factory=dict)


@dataclass(slots=True)
class _Probe:
    seq: int
    target: str
    acked: bool = False
    expected_nacks: int = 0
    nacks: int = 0


@dataclass(slots=True)
class _Relay:
    requester: Addr
    seq: int
    nack: bool


class Prober:
    """The probe in flight and the pings relayed for others; `probe_timeout` and
    `relay_timeout` deadlines go to `deadlines`, whose owner calls back."""

    def __init__(
        self,
        name: str,
        addr: Addr,
        prof: Profile,
        table: MemberTable,
        awareness: Awareness,
        deadlines: Deadlines,
        counters: Counters,
    ) -> None:
        self.name = name
        self.addr = addr
        self.p = prof
        self.table = table
        self.awareness = awareness
        self.deadlines = deadlines
        self.counters = counters
        self._seq = 0
        self._probe: _Probe | None = None
        self._relays: dict[int, _Relay] = {}

    def _next_seq(self) -> int:
        self._seq += 1
        return self._seq

    def probe(self, now: float) -> Out | None:
        """Ping the next member in the round-robin, if any is live."""
        target = self.table.next_target()
        if target is None:
            return None
        seq = self._next_seq()
        self._probe = _Probe(seq, target.name)
        self.counters.probes += 1
        msgs: list[Msg] = []
        if target.status == SUSPECT and self.p.lifeguard:
            msgs.append(Suspect(target.name, target.incarnation, self.name))  # buddy system
        msgs.append(Ping(seq, target.name, self.name, self.addr))
        self.deadlines.at(now + self.awareness.scale(self.p.probe_timeout), "probe_timeout", seq)
        return target.addr, msgs

    def timeout(self, seq: int) -> list[Out]:
        """No ack in time: ask helpers to ping the target for us."""
        pr = self._probe
        if pr is None or pr.seq != seq or pr.acked:
            return []
        target = self.table.get(pr.target)
        if target is None:
            return []
        helpers = self.table.pick(self.p.indirect_checks, True, exclude=pr.target)
        pr.expected_nacks = len(helpers)
        return [
            (h.addr, [PingReq(seq, target.name, target.addr, self.name, self.addr, True)])
            for h in helpers
        ]

    def finish(self, late: float) -> Member | None:
        """Judge the probe in flight, if any; the member to suspect when it failed.
        `late`: how late the timer that judges it fired."""
        pr, self._probe = self._probe, None
        if pr is None:
            return None
        if pr.acked:
            self.awareness.apply_delta(-1)
            return None
        if self.p.lifeguard and late > self.p.probe_timeout:
            # This node ran late (a busy event loop): the ack may be waiting unread in the
            # socket, and the shell runs due timers before it reads packets. Lifeguard: the
            # slow one is us, so back off (awareness up) and accuse nobody.
            self.counters.late_probes += 1
            self.awareness.apply_delta(1)
            return None
        self.counters.failed_probes += 1
        self.awareness.apply_delta(nack_delta(pr.expected_nacks, pr.nacks))
        m = self.table.get(pr.target)
        if m is not None and m.status in (ALIVE, SUSPECT):
            # On a member already suspected this is an independent confirmation (Lifeguard).
            return m
        return None

    def on_ping(self, msg: Ping) -> Out | None:
        if msg.target != self.name:
            return None
        return msg.source_addr, [Ack(msg.seq, self.name)]

    def on_ack(self, msg: Ack) -> Out | None:
        """Our probe's ack, or one to relay back to the member that asked us to ping."""
        pr = self._probe
        if pr is not None and pr.seq == msg.seq:
            pr.acked = True
            return None
        r = self._relays.pop(msg.seq, None)
        if r is None:
            return None
        return r.requester, [Ack(r.seq, msg.source)]

    def on_ping_req(self, now: float, msg: PingReq) -> Out:
        """Ping the target for a prober under our own sequence number."""
        seq = self._next_seq()
        self._relays[seq] = _Relay(msg.source_addr, msg.seq, msg.nack)
        self.deadlines.at(now + self._nack_after(), "relay_timeout", seq)
        return msg.target_addr, [Ping(seq, msg.target, self.name, self.addr)]

    def on_nack(self, msg: Nack) -> bool:
        """Count a helper's nack; True when every helper failed too (judge now)."""
        pr = self._probe
        if pr is None or pr.seq != msg.seq:
            return False
        pr.nacks += 1
        return pr.nacks >= pr.expected_nacks and not pr.acked

    def relay_timeout(self, seq: int) -> Out | None:
        r = self._relays.pop(seq, None)
        if r is None or not r.nack:
            return None
        return r.requester, [Nack(r.seq, self.name)]

    def _nack_after(self) -> float:
        """A helper's nack must reach the prober before its probe period ends, or Lifeguard
        would blame the prober's own health for a target that is really gone."""
        p = self.p
        return min(p.probe_timeout, 0.8 * (p.probe_interval - p.probe_timeout))
