"""GossipNode: the thin asyncio shell around the Membership core.

It wires core + codec/keyring + transport + a `Clock` and executes the
core's effects. No global state: embed as many nodes as you like in one
process (the agent embeds one; tests embed several on a MemoryNetwork).
"""

from __future__ import annotations

import asyncio
import hashlib
import random
import secrets
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kovanex.clock import SYSTEM, Clock, Timer
from kovanex.core.effects import Publish, Send, SendStream, SetTimer
from kovanex.core.gossip_msgs import MemberState, PushPull, Received, StreamReceived
from kovanex.core.gossip_profiles import Profile
from kovanex.core.gossip_profiles import profile as get_profile
from kovanex.core.membership import Membership
from kovanex.net.codec import Decoder, Encoder, Stats
from kovanex.net.keyring import Keyring
from kovanex.net.transport import Addr, Transport, UdpTcpTransport


@dataclass(frozen=True, slots=True)
class MemberInfo:
    """What callers see of a member; `meta` is its role/labels/capabilities/slots dict."""

    name: str
    addr: Addr
    status: str  # alive | suspect | dead | left
    incarnation: int
    meta: dict[str, Any]

    @classmethod
    def of(cls, s: MemberState) -> MemberInfo:
        return cls(s.name, s.addr, s.status, s.incarnation, s.meta)


Callback = Callable[[str, Any], None]
MEMBER_EVENTS = ("member-join", "member-leave", "member-failed", "member-update")


def key_fingerprint(key: bytes) -> str:
    return hashlib.sha256(key).hexdigest()[:12]


class GossipNode:
    """One gossip member. Methods are called from the event loop thread."""

    def __init__(
        self,
        name: str,
        profile: Profile | str = "lan",
        keyring: Keyring | None = None,
        meta: dict[str, Any] | None = None,
        label: str = "",
        transport: Transport | None = None,
        seed: int | None = None,
        clock: Clock = SYSTEM,
    ) -> None:
        self.name = name
        self.clock = clock  # the core's time and its probe timer: virtual in tests
        self.profile = get_profile(profile) if isinstance(profile, str) else profile
        self.keyring = keyring if keyring is not None else Keyring()
        self.label = label
        self.transport: Transport = transport or UdpTcpTransport(clock)
        self._rng = random.Random(seed if seed is not None else secrets.randbits(64))
        self._meta = dict(meta or {})
        self._stats = Stats()
        self._subs: dict[str, list[Callback]] = defaultdict(list)
        self._core: Membership | None = None
        self._enc: Encoder | None = None
        self._dec = Decoder(self.keyring, label, self._stats)
        self._timer: Timer | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._changed: asyncio.Event | None = None  # created in start(), inside the loop
        self.failed_events = 0
        self._replied: dict[str, float] = {}  # push-pull reply source -> when it was applied

    # ------------------------------------------------------------ lifecycle
    @property
    def addr(self) -> Addr:
        """The bound (advertised) address; valid after start()."""
        return self.transport.local_addr

    @property
    def core(self) -> Membership:
        if self._core is None:
            raise RuntimeError("GossipNode.start() first")
        return self._core

    async def start(self, bind: Addr = ("127.0.0.1", 0)) -> Addr:
        """Bind the transport (port 0 = a free port) and start probing/gossiping."""
        self._loop = asyncio.get_running_loop()
        self._changed = asyncio.Event()
        addr = await self.transport.start(bind, self._on_packet, self._on_stream)
        self._core = Membership(self.name, addr, self.profile, self._rng, self._meta)
        epoch = time.time_ns() // 1000  # grows across restarts: the replay window's epoch
        self._enc = Encoder(self.name, epoch, self.keyring, self.label, self._stats)
        self._run(self._core.start(self._now()))
        return addr

    async def join(self, addrs: list[Addr], timeout: float = 5.0) -> int:
        """Push-pull with each address; returns how many could be reached."""
        core = self.core
        pps = [e for e in core.join(self._now(), list(addrs)) if isinstance(e, SendStream)]
        sent = await asyncio.gather(*(self._send_stream(e.addr, e.msg, timeout) for e in pps))
        return sum(sent)

    async def sync(self, addrs: list[Addr], timeout: float = 2.0) -> set[str]:
        """Push-pull with each address and wait (bounded) for the replies: the names whose
        full state we applied. Why: a node back from a partition must know the owner
        records before it acts on its own (core/rejoin.py)."""
        t0 = self._now()
        sent = await self.join(addrs, timeout)

        def answered() -> set[str]:
            return {n for n, at in self._replied.items() if at >= t0}

        await self.wait_for(lambda: len(answered()) >= sent, max(0.0, t0 + timeout - self._now()))
        return answered()

    async def leave(self, timeout: float = 3.0) -> None:
        """Broadcast our departure, wait (bounded) until it has gone out, then stop."""
        self._run(self.core.leave(self._now()))
        await self.wait_for(lambda: self.core.pending_broadcasts() == 0, timeout)
        await self.close()

    async def close(self) -> None:
        """Stop without telling anyone (others will detect the failure)."""
        if self._timer is not None:
            self._timer.cancel()
        for t in list(self._tasks):
            t.cancel()
        await self.transport.close()

    async def wait_for(self, cond: Callable[[], bool], timeout: float) -> bool:
        """Wait until cond() holds (re-checked on each state change) or the deadline passes."""
        assert self._changed is not None
        deadline = self._now() + timeout
        while not cond():
            left = deadline - self._now()
            if left <= 0:
                return False
            self._changed.clear()
            try:
                await self.clock.wait_for(self._changed.wait(), min(left, 0.05))
            except TimeoutError:
                pass
        return True

    # -------------------------------------------------------------- queries
    def members(self) -> list[MemberInfo]:
        return [MemberInfo.of(s) for s in self.core.member_list()]

    def stats(self) -> dict[str, Any]:
        out = self._stats.as_dict()
        c = self.core.counters if self._core else None
        if c is not None:
            out.update(probes=c.probes, failed_probes=c.failed_probes, refutes=c.refutes)
            out["awareness"] = self.core.awareness.score
        return out

    def get(self, topic: str, key: str) -> Any:
        e = self.core.app.get((topic, key))
        return None if e is None else e.value

    def topics(self) -> set[str]:
        """Every application topic with a live key (what SyncState lists)."""
        return {t for (t, _), e in self.core.app.items() if e.value is not None}

    def items(self, topic: str) -> dict[str, Any]:
        """Live keys of a topic (a None value is a tombstone: not listed)."""
        return {
            k: e.value for (t, k), e in self.core.app.items() if t == topic and e.value is not None
        }

    # ------------------------------------------------------------- commands
    def force_leave(self, name: str) -> None:
        self._run(self.core.force_leave(self._now(), name))

    def set_meta(self, meta: dict[str, Any]) -> None:
        """Replace this node's meta (role, labels, capabilities, slots, http address...)."""
        if self._core is None:
            self._meta = dict(meta)  # before start(): becomes the initial meta
            return
        self._run(self.core.set_meta(self._now(), meta))

    def publish(self, topic: str, key: str, value: Any) -> None:
        self._run(self.core.publish(self._now(), topic, key, value))

    def subscribe(self, topic: str, callback: Callback) -> Callable[[], None]:
        """callback(topic, payload); payload is a MemberInfo for member-* topics and an
        AppData(topic, key, value, origin, version) otherwise; "*" receives everything.
        Returns an unsubscribe function."""
        self._subs[topic].append(callback)
        return lambda: self._subs[topic].remove(callback)

    def install_key(self, key: str | bytes) -> None:
        self.keyring.install(key)
        self._notify()

    def use_key(self, key: str | bytes) -> None:
        self.keyring.use(key)
        self._notify()

    def remove_key(self, key: str | bytes) -> None:
        self.keyring.remove(key)
        self._notify()

    def list_keys(self) -> list[str]:
        return self.keyring.list()

    # ------------------------------------------------------------ internals
    def _now(self) -> float:
        return self.clock.monotonic()

    def _notify(self) -> None:
        if self._changed is not None:
            self._changed.set()

    def _on_packet(self, data: bytes, addr: Addr) -> None:
        msgs = self._dec.decode(data)
        if msgs and self._core is not None:
            self._run(self._core.handle(self._now(), Received(addr, tuple(msgs))))

    def _on_stream(self, data: bytes, addr: Addr) -> None:
        msgs = self._dec.decode(data, stream=True)
        if not msgs or self._core is None:
            return
        for m in msgs:
            if isinstance(m, PushPull):
                self._run(self._core.handle(self._now(), StreamReceived(addr, m)))
                if m.reply:
                    self._replied[m.source] = self._now()

    def _tick(self) -> None:
        self._timer = None
        if self._core is not None:
            self._run(self._core.tick(self._now()))

    def _run(self, effects: list[Any]) -> None:
        assert self._loop is not None and self._enc is not None
        for e in effects:
            if isinstance(e, Send):
                for pkt in self._enc.encode(e.msg):
                    self.transport.send_packet(pkt, e.addr)
            elif isinstance(e, SetTimer):
                if self._timer is not None:
                    self._timer.cancel()
                self._timer = self.clock.call_later(e.at - self._now(), self._tick)
            elif isinstance(e, SendStream):
                t = self._loop.create_task(self._send_stream(e.addr, e.msg, 5.0))
                self._tasks.add(t)
                t.add_done_callback(self._tasks.discard)
            elif isinstance(e, Publish):
                if e.topic == "member-failed":
                    self.failed_events += 1
                payload = MemberInfo.of(e.payload) if e.topic in MEMBER_EVENTS else e.payload
                for cb in [*self._subs.get(e.topic, ()), *self._subs.get("*", ())]:
                    try:
                        cb(e.topic, payload)
                    except Exception:  # noqa: BLE001 - a subscriber must not kill gossip
                        self._stats.dropped["callback_error"] += 1
        self._notify()

    async def _send_stream(self, addr: Addr, msg: PushPull, timeout: float) -> bool:
        assert self._enc is not None
        ok = await self.transport.send_stream(self._enc.encode_stream(msg), addr, timeout)
        if not ok:
            self._stats.dropped["stream_unreachable"] += 1
        return ok
