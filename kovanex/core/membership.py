"""SWIM membership with Lifeguard, as a pure core (memberlist state.go + net.go logic).

`Membership` owns the member states and their merge rules: suspicion/refutation with
incarnations, gossip piggybacking, push-pull sync, leave/force-leave and reaping with
tombstones. It is built from small parts it gives their collaborators: the member
table (`member_table.py`), the probe cycle (`probe.py`: ping, ping-req, nack), the
application key/value channel (`app_channel.py`) and one deadline heap
(`deadlines.py`). It never does I/O: `handle(now, event)` and `tick(now)` return
effects (Send, SendStream, SetTimer, Publish) that a shell or the simulator executes.
It asks for a single wake-up via `SetTimer("gossip", at)` whenever the earliest
deadline changes.
"""

from __future__ import annotations

import math
from typing import Any

from kovanex.core.app_channel import AppChannel
from kovanex.core.awareness import Awareness
from kovanex.core.broadcast import BroadcastQueue, retransmit_limit
from kovanex.core.deadlines import Deadlines
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
from kovanex.core.member_table import Member, MemberTable
from kovanex.core.probe import Counters, Prober
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
        self.table = MemberTable(self.me, rng, prof.gossip_to_the_dead)
        self.members = self.table.members  # the same dicts, never rebound: read them freely
        self.tombstones = self.table.tombstones
        self.channel = AppChannel()
        self.app = self.channel.values
        self.mq = BroadcastQueue()
        self.aq = self.channel.queue
        self.deadlines = Deadlines()
        self._late = 0.0  # how late the timer being run fired (its due time to `now`)
        self._asked: float | None = None
        self.counters = Counters()
        self.prober = Prober(
            name, addr, prof, self.table, self.awareness, self.deadlines, self.counters
        )
        self.leaving = False
        self.started = False

    # ----------------------------------------------------------------- API
    def start(self, now: float) -> list[Effect]:
        """Arm the periodic timers and announce ourselves."""
        self.started = True
        self.me.changed = now
        self._queue_alive()
        p, at = self.p, self.deadlines.at
        at(now + self.rng.uniform(0, p.probe_interval), "probe")
        at(now + self.rng.uniform(0, p.gossip_interval), "gossip")
        at(now + self.rng.uniform(0.5, 1.0) * self._push_pull_every(), "pushpull")
        at(now + self._reap_every(), "reap")
        at(now + self.rng.uniform(0.5, 1.0) * p.reconnect_interval, "reconnect")
        return self._finish([])

    def join(self, now: float, addrs: list[Addr]) -> list[Effect]:
        """Push-pull with each seed address; their replies bring the full state."""
        fx: list[Effect] = [SendStream(a, self._pushpull(join=True, reply=False)) for a in addrs]
        return self._finish(fx)

    def leave(self, now: float) -> list[Effect]:
        """Graceful leave: broadcast Dead(me, source=me) and stop probing."""
        self.leaving = True
        d = Dead(self.name, self.me.incarnation, self.name)
        self.table.set_status(self.me, LEFT, now)
        self._queue(d, "m:" + self.name)
        fx: list[Effect] = []
        for m in self.table.pick(self.p.fanout * 2, live_only=True):
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
        A None value is a tombstone (app_channel.py)."""
        entry = self.channel.write(topic, key, value, self.name, self.p.packet_budget // 2)
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
        while (due := self.deadlines.pop_due(now)) is not None:
            at, kind, arg = due
            self._late = now - at
            getattr(self, "_t_" + kind)(now, arg, fx)
        self._late = 0.0
        self._asked = None  # a shell timer may fire a hair early: always re-arm
        return self._finish(fx)

    def preload(self, now: float, states: list[MemberState]) -> None:
        """Install known members without gossip or events (simulator bootstrap)."""
        self.table.preload(now, states)

    def member_list(self) -> list[MemberState]:
        return [m.state() for m in self.members.values()]

    def live_count(self) -> int:
        return self.table.live

    def pending_broadcasts(self) -> int:
        return len(self.mq) + len(self.aq)

    # --------------------------------------------------------- internals
    def _check_meta(self, meta: dict[str, Any]) -> None:
        size = encoded_size(Alive(self.name, self.addr, 0, meta))
        if size > self.p.meta_max + 100:
            raise ValueError(f"member meta too large ({size} bytes, max {self.p.meta_max})")

    def _reap_every(self) -> float:
        return max(1.0, min(self.p.dead_reap, self.p.left_reap) / 4)

    def _finish(self, fx: list[Effect]) -> list[Effect]:
        earliest = self.deadlines.earliest()
        if earliest is not None and earliest != self._asked:
            self._asked = earliest
            fx.append(SetTimer(TIMER_KEY, earliest))
        return fx

    def _queue(self, msg: Msg, name: str | None) -> None:
        self.mq.queue(msg, encoded_size(msg), name)

    def _queue_alive(self) -> None:
        m = self.me
        self._queue(Alive(m.name, m.addr, m.incarnation, m.meta), "m:" + m.name)

    def _piggyback(self, budget: int) -> list[Msg]:
        """Fill `budget` bytes; app data gets a reserved share when queued (memberlist #299)."""
        limit = retransmit_limit(self.p.retransmit_mult, self.table.live)
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

    def _pushpull(self, join: bool, reply: bool) -> PushPull:
        states = tuple(self.table.states())
        return PushPull(self.name, self.addr, join, reply, states, tuple(self.app.values()))

    # ------------------------------------------------------------ timers
    def _t_probe(self, now: float, _: Any, fx: list[Effect]) -> None:
        self._judge_probe(now, fx)
        self.deadlines.at(now + self.awareness.scale(self.p.probe_interval), "probe")
        if self.leaving:
            return
        out = self.prober.probe(now)
        if out is not None:
            fx.append(self._send(*out))

    def _judge_probe(self, now: float, fx: list[Effect]) -> None:
        m = self.prober.finish(self._late)
        if m is not None:
            self._on_suspect(now, Suspect(m.name, m.incarnation, self.name), fx)

    def _t_probe_timeout(self, now: float, seq: int, fx: list[Effect]) -> None:
        for addr, msgs in self.prober.timeout(seq):
            fx.append(self._send(addr, msgs))

    def _t_relay_timeout(self, now: float, seq: int, fx: list[Effect]) -> None:
        out = self.prober.relay_timeout(seq)
        if out is not None:
            fx.append(self._send(*out))

    def _t_gossip(self, now: float, _: Any, fx: list[Effect]) -> None:
        self.deadlines.at(now + self.p.gossip_interval, "gossip")
        if self.pending_broadcasts() == 0:
            return
        for m in self.table.pick(self.p.fanout, live_only=False, now=now):
            msgs = self._piggyback(self.p.packet_budget)
            if not msgs:
                break
            fx.append(Send(m.addr, tuple(msgs)))

    def _push_pull_every(self) -> float:
        """memberlist's pushPullScale: full syncs get rarer beyond 32 members."""
        n = self.table.live
        scale = 1 if n <= 32 else math.ceil(math.log2(n) - math.log2(32)) + 1
        return self.p.push_pull_interval * scale

    def _t_pushpull(self, now: float, _: Any, fx: list[Effect]) -> None:
        self.deadlines.at(now + self._push_pull_every(), "pushpull")
        if self.leaving:
            return
        for m in self.table.pick(1, live_only=True):
            fx.append(SendStream(m.addr, self._pushpull(join=False, reply=False)))

    def _t_reconnect(self, now: float, _: Any, fx: list[Effect]) -> None:
        """Serf's reconnect: with probability dead/live, push-pull with a random dead member."""
        self.deadlines.at(now + self.p.reconnect_interval, "reconnect")
        t = self.table
        if self.leaving or not t.dead:
            return
        if self.rng.random() > len(t.dead) / max(1, t.live):
            return
        dead = sorted(t.dead)  # sorted: deterministic for a seed
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
        self.deadlines.at(now + self._reap_every(), "reap")
        p = self.p
        self.table.reap(now, p.dead_reap, p.left_reap, p.tombstone_ttl)
        self.channel.reap(now, p.tombstone_ttl)

    # ---------------------------------------------------------- messages
    def _dispatch(self, now: float, addr: Addr, msg: Msg, fx: list[Effect]) -> None:
        out: tuple[Addr, list[Msg]] | None = None
        if isinstance(msg, Ping):
            out = self.prober.on_ping(msg)
        elif isinstance(msg, Ack):
            out = self.prober.on_ack(msg)
        elif isinstance(msg, Alive):
            self._on_alive(now, msg, fx)
        elif isinstance(msg, Suspect):
            self._on_suspect(now, msg, fx)
        elif isinstance(msg, Dead):
            self._on_dead(now, msg, fx)
        elif isinstance(msg, AppData):
            self._on_app(msg, fx)
        elif isinstance(msg, PingReq):
            out = self.prober.on_ping_req(now, msg)
        elif isinstance(msg, Nack):
            if self.prober.on_nack(msg):
                self._judge_probe(now, fx)  # every helper failed too: decide now
        elif isinstance(msg, PushPull):
            self._on_pushpull(now, addr, msg, fx)
        if out is not None:
            fx.append(self._send(*out))

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
            self.table.add(m)
            self._queue(a, "m:" + a.name)
            fx.append(Publish(MEMBER_JOIN, m.state()))
            return
        if a.incarnation <= m.incarnation:
            return
        was = m.status
        changed = a.addr != m.addr or a.meta != m.meta
        m.incarnation, m.addr, m.meta = a.incarnation, a.addr, dict(a.meta)  # new addr ok (#157)
        if was != ALIVE:
            self.table.set_status(m, ALIVE, now)
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
                self.deadlines.at(m.suspicion.deadline(), "suspicion", (m.name, m.suspicion))
            return
        m.incarnation = s.incarnation
        self.table.set_status(m, SUSPECT, now)
        self.counters.suspects_started += 1
        n = self.table.live
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
        self.deadlines.at(m.suspicion.deadline(), "suspicion", (m.name, m.suspicion))

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
        self.table.set_status(m, LEFT if left else DEAD, now)
        self._queue(d, "m:" + d.name)
        fx.append(Publish(MEMBER_LEAVE if left else MEMBER_FAILED, m.state()))

    def _on_app(self, a: AppData, fx: list[Effect]) -> None:
        if self.channel.merge(a):
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
