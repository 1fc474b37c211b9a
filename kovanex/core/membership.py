"""SWIM membership with Lifeguard, as a pure core (memberlist state.go + net.go logic).

`Membership` owns the member table, the probe cycle (ping, ping-req, nack),
suspicion/refutation with incarnations, gossip piggybacking, push-pull sync,
leave/force-leave, reaping with tombstones, and the application key/value
channel. It never does I/O: `handle(now, event)` and `tick(now)` return
effects (Send, SendStream, SetTimer, Publish) that a shell or the simulator
executes. All its internal deadlines live in one heap; it asks for a single
wake-up via `SetTimer("gossip", at)` whenever the earliest deadline changes.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field
from typing import Any

from kovanex.core.awareness import Awareness, nack_delta
from kovanex.core.broadcast import BroadcastQueue, retransmit_limit
from kovanex.core.effects import Addr, Publish, Send, SendStream, SetTimer
from kovanex.core.gossip_msgs import (
    ALIVE,
    DEAD,
    LEFT,
    SUSPECT,
    Ack,
    Alive,
    AppData,
    Dead,
    MemberState,
    Msg,
    Nack,
    Ping,
    PingReq,
    PushPull,
    Received,
    StreamReceived,
    Suspect,
    encoded_size,
)
from kovanex.core.gossip_profiles import Profile
from kovanex.core.rng import Rng
from kovanex.core.suspicion import Suspicion, suspicion_timeout

Effect = Send | SendStream | SetTimer | Publish
TIMER_KEY = "gossip"
MEMBER_JOIN, MEMBER_LEAVE, MEMBER_FAILED, MEMBER_UPDATE = (
    "member-join",
    "member-leave",
    "member-failed",
    "member-update",
)
MAX_NAME = 64


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


class Membership:
    """One node's SWIM state machine. Not thread-safe; one caller drives it."""

    def __init__(
        self,
        name: str,
        addr: Addr,
        prof: Profile,
        rng: Rng,
        meta: dict[str, Any] | None = None,
    ) -> None:
        if not name or len(name.encode()) > MAX_NAME:
            raise ValueError(f"member name must be 1..{MAX_NAME} bytes")
        self.name = name
        self.addr = addr
        self.p = prof
        self.rng = rng
        self.awareness = Awareness(prof.awareness_max, enabled=prof.lifeguard)
        self.me = Member(name, addr, 0, ALIVE, dict(meta or {}))
        self._check_meta(self.me.meta)
        self.members: dict[str, Member] = {name: self.me}
        self._names: list[str] = []  # every member but me, for O(1) random picks
        self._live = 1
        self._dead: set[str] = set()  # names currently DEAD (reconnect candidates)
        self.tombstones: dict[str, tuple[int, float, str]] = {}  # name -> (inc, since, status)
        self.app: dict[tuple[str, str], AppData] = {}
        self._app_gone: dict[tuple[str, str], float] = {}  # value None: a tombstone, since
        self._app_clock = 0
        self.mq = BroadcastQueue()
        self.aq = BroadcastQueue()
        self._heap: list[tuple[float, int, str, Any]] = []
        self._late = 0.0  # how late the timer being run fired (its due time to `now`)
        self._hseq = 0
        self._asked: float | None = None
        self._seq = 0
        self._probe: _Probe | None = None
        self._order: list[str] = []
        self._order_i = 0
        self._relays: dict[int, _Relay] = {}
        self.leaving = False
        self.started = False
        self.counters = Counters()

    # ----------------------------------------------------------------- API
    def start(self, now: float) -> list[Effect]:
        """Arm the periodic timers and announce ourselves."""
        self.started = True
        self.me.changed = now
        self._queue_alive()
        p = self.p
        self._at(now + self.rng.uniform(0, p.probe_interval), "probe")
        self._at(now + self.rng.uniform(0, p.gossip_interval), "gossip")
        self._at(now + self.rng.uniform(0.5, 1.0) * self._push_pull_every(), "pushpull")
        self._at(now + self._reap_every(), "reap")
        self._at(now + self.rng.uniform(0.5, 1.0) * p.reconnect_interval, "reconnect")
        return self._finish([])

    def join(self, now: float, addrs: list[Addr]) -> list[Effect]:
        """Push-pull with each seed address; their replies bring the full state."""
        fx: list[Effect] = [SendStream(a, self._pushpull(join=True, reply=False)) for a in addrs]
        return self._finish(fx)

    def leave(self, now: float) -> list[Effect]:
        """Graceful leave: broadcast Dead(me, source=me) and stop probing."""
        self.leaving = True
        d = Dead(self.name, self.me.incarnation, self.name)
        self._set_status(self.me, LEFT, now)
        self._queue(d, "m:" + self.name)
        fx: list[Effect] = []
        for m in self._pick(self.p.fanout * 2, live_only=True):
            fx.append(self._send(m.addr, []))  # the queued Dead rides first
        return self._finish(fx)

    def force_leave(self, now: float, name: str) -> list[Effect]:
        """Mark a (usually failed) member as left everywhere; an alive one will refute."""
        m = self.members.get(name)
        if m is None or name == self.name:
            return self._finish([])
        fx: list[Effect] = []
        self._on_dead(now, Dead(name, m.incarnation, name), fx)
        return self._finish(fx)

    def set_meta(self, now: float, meta: dict[str, Any]) -> list[Effect]:
        """Replace our metadata; a new incarnation carries it to everyone."""
        self._check_meta(meta)
        fx: list[Effect] = []
        if meta != self.me.meta:
            self.me.meta = dict(meta)
            self.me.incarnation += 1
            self._queue_alive()
            fx.append(Publish(MEMBER_UPDATE, self.me.state()))
        return self._finish(fx)

    def publish(self, now: float, topic: str, key: str, value: Any) -> list[Effect]:
        """Set (topic, key) = value cluster-wide; last writer wins by (version, origin).
        A None value is a tombstone: it spreads like a value, then is reaped after
        `tombstone_ttl`, so keys of finished work do not pile up forever."""
        old = self.app.get((topic, key))
        self._app_clock = max(self._app_clock, old.version if old else 0) + 1
        entry = AppData(topic, key, value, self.name, self._app_clock)
        size = encoded_size(entry)
        if size > self.p.packet_budget // 2:
            raise ValueError(f"app value too large for one packet ({size} bytes)")
        self.app[(topic, key)] = entry
        self.aq.queue(entry, size, f"a:{topic}:{key}")
        return self._finish([Publish(topic, entry)])

    def handle(self, now: float, event: Received | StreamReceived) -> list[Effect]:
        """Process one decoded packet (several messages) or one push-pull stream."""
        fx: list[Effect] = []
        if isinstance(event, StreamReceived):
            self._on_pushpull(now, event.addr, event.msg, fx)
        else:
            for msg in event.msgs:
                self._dispatch(now, event.addr, msg, fx)
        return self._finish(fx)

    def tick(self, now: float) -> list[Effect]:
        """Run every internal deadline that is due."""
        fx: list[Effect] = []
        h = self._heap
        while h and h[0][0] <= now:
            at, _, kind, arg = heapq.heappop(h)
            self._late = now - at
            getattr(self, "_t_" + kind)(now, arg, fx)
        self._late = 0.0
        self._asked = None  # a shell timer may fire a hair early: always re-arm
        return self._finish(fx)

    def preload(self, now: float, states: list[MemberState]) -> None:
        """Install known members without gossip or events (simulator bootstrap)."""
        members, names = self.members, self._names
        for s in states:
            if s.name not in members:
                members[s.name] = Member(s.name, s.addr, s.incarnation, s.status, s.meta, now)
                names.append(s.name)
                self._live += s.status in (ALIVE, SUSPECT)
                if s.status == DEAD:
                    self._dead.add(s.name)

    def member_list(self) -> list[MemberState]:
        return [m.state() for m in self.members.values()]

    def live_count(self) -> int:
        return self._live

    def pending_broadcasts(self) -> int:
        return len(self.mq) + len(self.aq)

    # --------------------------------------------------------- internals
    def _check_meta(self, meta: dict[str, Any]) -> None:
        size = encoded_size(Alive(self.name, self.addr, 0, meta))
        if size > self.p.meta_max + 100:
            raise ValueError(f"member meta too large ({size} bytes, max {self.p.meta_max})")

    def _reap_every(self) -> float:
        return max(1.0, min(self.p.dead_reap, self.p.left_reap) / 4)

    def _at(self, at: float, kind: str, arg: Any = None) -> None:
        self._hseq += 1
        heapq.heappush(self._heap, (at, self._hseq, kind, arg))

    def _finish(self, fx: list[Effect]) -> list[Effect]:
        if self._heap and self._heap[0][0] != self._asked:
            self._asked = self._heap[0][0]
            fx.append(SetTimer(TIMER_KEY, self._asked))
        return fx

    def _next_seq(self) -> int:
        self._seq += 1
        return self._seq

    def _queue(self, msg: Msg, name: str | None) -> None:
        self.mq.queue(msg, encoded_size(msg), name)

    def _queue_alive(self) -> None:
        m = self.me
        self._queue(Alive(m.name, m.addr, m.incarnation, m.meta), "m:" + m.name)

    def _set_status(self, m: Member, status: str, now: float) -> None:
        was_live = m.status in (ALIVE, SUSPECT)
        is_live = status in (ALIVE, SUSPECT)
        self._live += is_live - was_live
        m.status = status
        m.changed = now
        if status == DEAD:
            self._dead.add(m.name)
        else:
            self._dead.discard(m.name)
        if status != SUSPECT:
            m.suspicion = None

    def _piggyback(self, budget: int) -> list[Msg]:
        """Fill `budget` bytes; app data gets a reserved share when queued (memberlist #299)."""
        limit = retransmit_limit(self.p.retransmit_mult, self._live)
        if len(self.aq) == 0:
            return self.mq.take(budget, limit)[0]
        if len(self.mq) == 0:
            return self.aq.take(budget, limit)[0]
        reserve = int(budget * self.p.app_reserve)
        mem, used = self.mq.take(budget - reserve, limit)
        app, _ = self.aq.take(budget - used, limit)
        return mem + app

    def _send(self, addr: Addr, primary: list[Msg]) -> Send:
        budget = self.p.packet_budget - sum(encoded_size(m) for m in primary) - 3
        msgs = primary + self._piggyback(budget) if budget > 16 else primary
        return Send(addr, tuple(msgs))

    def _pick(self, k: int, live_only: bool, now: float = 0.0, exclude: str = "") -> list[Member]:
        """Up to k distinct random members other than me (rejection sampling, O(k))."""
        names = self._names
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
                not live_only and m.status == DEAD and now - m.changed < self.p.gossip_to_the_dead
            ):
                out[m.name] = m
        return list(out.values())

    def _add(self, m: Member) -> None:
        self.members[m.name] = m
        self._names.append(m.name)
        if m.status in (ALIVE, SUSPECT):
            self._live += 1
        elif m.status == DEAD:
            self._dead.add(m.name)

    def _remove(self, name: str) -> None:
        m = self.members.pop(name)
        self._dead.discard(name)
        if m.status in (ALIVE, SUSPECT):
            self._live -= 1
        i = self._names.index(name)
        self._names[i] = self._names[-1]
        self._names.pop()

    def _pushpull(self, join: bool, reply: bool) -> PushPull:
        states = [m.state() for m in self.members.values()]
        states += [MemberState(n, ("", 0), i, st, {}) for n, (i, _, st) in self.tombstones.items()]
        return PushPull(self.name, self.addr, join, reply, tuple(states), tuple(self.app.values()))

    # ------------------------------------------------------------ timers
    def _t_probe(self, now: float, _: Any, fx: list[Effect]) -> None:
        self._finish_probe(now, fx)
        self._at(now + self.awareness.scale(self.p.probe_interval), "probe")
        if self.leaving:
            return
        target = self._next_target()
        if target is None:
            return
        seq = self._next_seq()
        self._probe = _Probe(seq, target.name)
        self.counters.probes += 1
        msgs: list[Msg] = []
        if target.status == SUSPECT and self.p.lifeguard:
            msgs.append(Suspect(target.name, target.incarnation, self.name))  # buddy system
        msgs.append(Ping(seq, target.name, self.name, self.addr))
        fx.append(self._send(target.addr, msgs))
        self._at(now + self.awareness.scale(self.p.probe_timeout), "probe_timeout", seq)

    def _next_target(self) -> Member | None:
        for _ in range(2):
            while self._order_i < len(self._order):
                m = self.members.get(self._order[self._order_i])
                self._order_i += 1
                if m is not None and m.status in (ALIVE, SUSPECT):
                    return m
            self._order = list(self._names)
            self.rng.shuffle(self._order)
            self._order_i = 0
        return None

    def _t_probe_timeout(self, now: float, seq: int, fx: list[Effect]) -> None:
        pr = self._probe
        if pr is None or pr.seq != seq or pr.acked:
            return
        target = self.members.get(pr.target)
        if target is None:
            return
        helpers = self._pick(self.p.indirect_checks, True, exclude=pr.target)
        pr.expected_nacks = len(helpers)
        for h in helpers:
            req = PingReq(seq, target.name, target.addr, self.name, self.addr, True)
            fx.append(self._send(h.addr, [req]))

    def _finish_probe(self, now: float, fx: list[Effect]) -> None:
        pr, self._probe = self._probe, None
        if pr is None:
            return
        if pr.acked:
            self.awareness.apply_delta(-1)
            return
        if self.p.lifeguard and self._late > self.p.probe_timeout:
            # This node ran late (a busy event loop): the ack may be waiting unread in the
            # socket, and the shell runs due timers before it reads packets. Lifeguard: the
            # slow one is us, so back off (awareness up) and accuse nobody.
            self.counters.late_probes += 1
            self.awareness.apply_delta(1)
            return
        self.counters.failed_probes += 1
        self.awareness.apply_delta(nack_delta(pr.expected_nacks, pr.nacks))
        m = self.members.get(pr.target)
        if m is not None and m.status in (ALIVE, SUSPECT):
            # On a member already suspected this is an independent confirmation (Lifeguard).
            self._on_suspect(now, Suspect(m.name, m.incarnation, self.name), fx)

    def _nack_after(self) -> float:
        """A helper's nack must reach the prober before its probe period ends, or Lifeguard
        would blame the prober's own health for a target that is really gone."""
        p = self.p
        return min(p.probe_timeout, 0.8 * (p.probe_interval - p.probe_timeout))

    def _t_relay_timeout(self, now: float, seq: int, fx: list[Effect]) -> None:
        r = self._relays.pop(seq, None)
        if r is not None and r.nack:
            fx.append(self._send(r.requester, [Nack(r.seq, self.name)]))

    def _t_gossip(self, now: float, _: Any, fx: list[Effect]) -> None:
        self._at(now + self.p.gossip_interval, "gossip")
        if self.pending_broadcasts() == 0:
            return
        for m in self._pick(self.p.fanout, live_only=False, now=now):
            msgs = self._piggyback(self.p.packet_budget)
            if not msgs:
                break
            fx.append(Send(m.addr, tuple(msgs)))

    def _push_pull_every(self) -> float:
        """memberlist's pushPullScale: full syncs get rarer beyond 32 members."""
        n = self._live
        scale = 1 if n <= 32 else math.ceil(math.log2(n) - math.log2(32)) + 1
        return self.p.push_pull_interval * scale

    def _t_pushpull(self, now: float, _: Any, fx: list[Effect]) -> None:
        self._at(now + self._push_pull_every(), "pushpull")
        if self.leaving:
            return
        for m in self._pick(1, live_only=True):
            fx.append(SendStream(m.addr, self._pushpull(join=False, reply=False)))

    def _t_reconnect(self, now: float, _: Any, fx: list[Effect]) -> None:
        """Serf's reconnect: with probability dead/live, push-pull with a random dead member."""
        self._at(now + self.p.reconnect_interval, "reconnect")
        if self.leaving or not self._dead:
            return
        if self.rng.random() > len(self._dead) / max(1, self._live):
            return
        dead = sorted(self._dead)  # sorted: deterministic for a seed
        m = self.members[dead[self.rng.randrange(len(dead))]]
        fx.append(SendStream(m.addr, self._pushpull(join=False, reply=False)))

    def _t_suspicion(self, now: float, arg: tuple[str, Suspicion], fx: list[Effect]) -> None:
        name, s = arg
        m = self.members.get(name)
        if m is None or m.suspicion is not s or m.status != SUSPECT or s.deadline() > now:
            return
        self.counters.deaths_declared += 1
        self._on_dead(now, Dead(name, m.incarnation, self.name), fx)

    def _t_reap(self, now: float, _: Any, fx: list[Effect]) -> None:
        self._at(now + self._reap_every(), "reap")
        p = self.p
        for m in list(self.members.values()):
            if m.name == self.name:
                continue
            age = now - m.changed
            if (m.status == DEAD and age >= p.dead_reap) or (
                m.status == LEFT and age >= p.left_reap
            ):
                self._remove(m.name)
                self.tombstones[m.name] = (m.incarnation, now, m.status)
        for n, (_, since, _) in list(self.tombstones.items()):
            if now - since >= p.tombstone_ttl:
                del self.tombstones[n]
        for k in [k for k, a in self.app.items() if a.value is None]:
            if now - self._app_gone.setdefault(k, now) >= p.tombstone_ttl:
                del self.app[k], self._app_gone[k]
        for k in [k for k in self._app_gone if k not in self.app or self.app[k].value is not None]:
            del self._app_gone[k]  # set again since

    # ---------------------------------------------------------- messages
    def _dispatch(self, now: float, addr: Addr, msg: Msg, fx: list[Effect]) -> None:
        if isinstance(msg, Ping):
            if msg.target == self.name:
                fx.append(self._send(msg.source_addr, [Ack(msg.seq, self.name)]))
        elif isinstance(msg, Ack):
            self._on_ack(now, msg, fx)
        elif isinstance(msg, Alive):
            self._on_alive(now, msg, fx)
        elif isinstance(msg, Suspect):
            self._on_suspect(now, msg, fx)
        elif isinstance(msg, Dead):
            self._on_dead(now, msg, fx)
        elif isinstance(msg, AppData):
            self._on_app(msg, fx)
        elif isinstance(msg, PingReq):
            seq = self._next_seq()
            self._relays[seq] = _Relay(msg.source_addr, msg.seq, msg.nack)
            fx.append(self._send(msg.target_addr, [Ping(seq, msg.target, self.name, self.addr)]))
            self._at(now + self._nack_after(), "relay_timeout", seq)
        elif isinstance(msg, Nack):
            pr = self._probe
            if pr is not None and pr.seq == msg.seq:
                pr.nacks += 1
                if pr.nacks >= pr.expected_nacks and not pr.acked:
                    self._finish_probe(now, fx)  # every helper failed too: decide now
        elif isinstance(msg, PushPull):
            self._on_pushpull(now, addr, msg, fx)

    def _on_ack(self, now: float, msg: Ack, fx: list[Effect]) -> None:
        pr = self._probe
        if pr is not None and pr.seq == msg.seq:
            pr.acked = True
            return
        r = self._relays.pop(msg.seq, None)
        if r is not None:
            fx.append(self._send(r.requester, [Ack(r.seq, msg.source)]))

    def _refute(self, incarnation: int) -> None:
        """Someone claims something stale about us: outbid it with a higher incarnation."""
        self.counters.refutes += 1
        self.me.incarnation = max(self.me.incarnation, incarnation) + 1
        self.awareness.apply_delta(1)
        self._queue_alive()

    def _on_alive(self, now: float, a: Alive, fx: list[Effect]) -> None:
        if a.name == self.name:
            me = self.me
            if self.leaving:
                return
            if a.incarnation > me.incarnation or (
                a.incarnation == me.incarnation and (a.addr != me.addr or a.meta != me.meta)
            ):
                self._refute(a.incarnation)
            return
        m = self.members.get(a.name)
        if m is None:
            tomb = self.tombstones.get(a.name)
            if tomb is not None and a.incarnation <= tomb[0]:
                return  # a stale state must not revive a removed member (#253, #312)
            self.tombstones.pop(a.name, None)
            m = Member(a.name, a.addr, a.incarnation, ALIVE, dict(a.meta), now)
            self._add(m)
            self._queue(a, "m:" + a.name)
            fx.append(Publish(MEMBER_JOIN, m.state()))
            return
        if a.incarnation <= m.incarnation:
            return
        was = m.status
        changed = a.addr != m.addr or a.meta != m.meta
        m.incarnation, m.addr, m.meta = a.incarnation, a.addr, dict(a.meta)  # new addr ok (#157)
        if was != ALIVE:
            self._set_status(m, ALIVE, now)
        self._queue(a, "m:" + a.name)
        if was in (DEAD, LEFT):
            fx.append(Publish(MEMBER_JOIN, m.state()))
        elif changed:
            fx.append(Publish(MEMBER_UPDATE, m.state()))

    def _on_suspect(self, now: float, s: Suspect, fx: list[Effect]) -> None:
        if s.name == self.name:
            if not self.leaving and s.incarnation >= self.me.incarnation:
                self._refute(s.incarnation)
            return
        m = self.members.get(s.name)
        if m is None or s.incarnation < m.incarnation or m.status in (DEAD, LEFT):
            return
        if m.status == SUSPECT and m.suspicion is not None:
            if m.suspicion.confirm(s.source):
                self._queue(s, "m:" + s.name)
                self._at(m.suspicion.deadline(), "suspicion", (m.name, m.suspicion))
            return
        m.incarnation = s.incarnation
        self._set_status(m, SUSPECT, now)
        self.counters.suspects_started += 1
        n = self._live
        p = self.p
        if p.fixed_suspicion_timeout > 0:
            lo, hi, k = p.fixed_suspicion_timeout, p.fixed_suspicion_timeout, 0
        else:
            lo = suspicion_timeout(p.suspicion_mult, n, p.probe_interval)
            hi = lo * p.suspicion_max_timeout_mult
            k = p.suspicion_mult - 2 if p.lifeguard else 0
            if n - 2 < k:
                k = 0
        m.suspicion = Suspicion(now, lo, hi, k, s.source, s.incarnation)
        self._queue(s, "m:" + s.name)
        self._at(m.suspicion.deadline(), "suspicion", (m.name, m.suspicion))

    def _on_dead(self, now: float, d: Dead, fx: list[Effect]) -> None:
        if d.name == self.name:
            if not self.leaving and d.incarnation >= self.me.incarnation:
                self._refute(d.incarnation)
            return
        m = self.members.get(d.name)
        if m is None:
            tomb = self.tombstones.get(d.name)
            if tomb is None or tomb[0] < d.incarnation:
                self.tombstones[d.name] = (d.incarnation, now, LEFT if d.source == d.name else DEAD)
            return
        left = d.source == d.name
        # A failed member may still become "left" (Serf force-leave), never the reverse.
        if d.incarnation < m.incarnation or m.status == LEFT or (m.status == DEAD and not left):
            return
        m.incarnation = d.incarnation
        self._set_status(m, LEFT if left else DEAD, now)
        self._queue(d, "m:" + d.name)
        fx.append(Publish(MEMBER_LEAVE if left else MEMBER_FAILED, m.state()))

    def _on_app(self, a: AppData, fx: list[Effect]) -> None:
        old = self.app.get((a.topic, a.key))
        if old is not None and (a.version, a.origin) <= (old.version, old.origin):
            return
        self.app[(a.topic, a.key)] = a
        self._app_clock = max(self._app_clock, a.version)
        self.aq.queue(a, encoded_size(a), f"a:{a.topic}:{a.key}")
        fx.append(Publish(a.topic, a))

    def _on_pushpull(self, now: float, addr: Addr, pp: PushPull, fx: list[Effect]) -> None:
        if not pp.reply:
            fx.append(SendStream(pp.source_addr, self._pushpull(join=False, reply=True)))
        for s in pp.states:
            if s.status == ALIVE:
                self._on_alive(now, Alive(s.name, s.addr, s.incarnation, s.meta), fx)
            elif s.status == LEFT:
                self._on_dead(now, Dead(s.name, s.incarnation, s.name), fx)
            elif s.name not in self.members and s.name != self.name:
                self._on_dead(now, Dead(s.name, s.incarnation, pp.source), fx)  # tombstone only
            else:
                # memberlist: a remote "dead" only makes us suspect, so we check for ourselves.
                self._on_suspect(now, Suspect(s.name, s.incarnation, pp.source), fx)
        for a in pp.app:
            self._on_app(a, fx)
