"""Drive N Membership cores over a SimNetwork by executing their effects in virtual time."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kovanex.core.effects import Publish, Send, SendStream, SetTimer
from kovanex.core.gossip_msgs import ALIVE, MemberState, Received, StreamReceived, encoded_size
from kovanex.core.gossip_profiles import Profile
from kovanex.core.membership import Membership
from kovanex.sim.loop import SimLoop
from kovanex.sim.network import SimNetwork

PACKET_OVERHEAD = 29 + 1 + 4 + 24  # encryption + version + crc + envelope (sender, seq)


@dataclass(slots=True)
class SimNode:
    name: str
    addr: tuple[str, int]
    core: Membership
    gen: int = 0
    up: bool = True
    stalled_until: float = 0.0
    paused_until: float = 0.0
    slow: float = 0.0  # extra delay before each received message is processed (backlog)
    events: list[tuple[float, str, Any]] = field(default_factory=list)
    bytes_out: int = 0
    packets_out: int = 0
    max_packet: int = 0
    stream_bytes_out: int = 0
    encoder: Any = None


class SimCluster:
    """A whole cluster in one process; `seed` fixes every random choice."""

    def __init__(
        self,
        n: int,
        prof: Profile,
        seed: int,
        loss: float = 0.0,
        duplicate: float = 0.0,
        delay: tuple[float, float] = (0.001, 0.005),
        bootstrap: str = "preload",
        measure_bytes: bool = False,
        record_events: bool = True,
    ) -> None:
        self.loop = SimLoop()
        self.net = SimNetwork(seed, loss, duplicate, delay)
        self.prof = prof
        self.seed = seed
        self.rng = random.Random(seed)
        self.nodes: dict[str, SimNode] = {}
        self.by_addr: dict[tuple[str, int], SimNode] = {}
        self.measure_bytes = measure_bytes
        self.record_events = record_events
        self.on_publish: list[Callable[[SimNode, Publish], None]] = []
        self.on_send: list[Callable[[SimNode, tuple[str, int], Any], None]] = []
        self._port = 7000
        names = [f"n{i:05d}" for i in range(n)]
        for name in names:
            self._spawn(name)
        if bootstrap == "preload":
            states = [MemberState(nd.name, nd.addr, 0, ALIVE, {}) for nd in self.nodes.values()]
            for nd in self.nodes.values():
                nd.core.preload(0.0, states)
            for nd in self.nodes.values():
                self._run(nd, nd.core.start(0.0))
        else:
            first = self.nodes[names[0]]
            self._run(first, first.core.start(0.0))
            for name in names[1:]:
                nd = self.nodes[name]
                self._run(nd, nd.core.start(0.0))
                self._run(nd, nd.core.join(0.0, [first.addr]))

    # ----------------------------------------------------------- control
    def _spawn(self, name: str) -> SimNode:
        self._port += 1
        addr = (f"10.{self._port // 65536}.{(self._port // 256) % 256}.{self._port % 256}", 7946)
        rng = random.Random(self.rng.getrandbits(64))
        node = SimNode(name, addr, Membership(name, addr, self.prof, rng))
        old = self.nodes.get(name)
        if old is not None:
            node.gen = old.gen + 1
        self.nodes[name] = node
        self.by_addr[addr] = node
        return node

    def crash(self, name: str) -> None:
        """Stop a node dead: no more sends, receives or timers."""
        nd = self.nodes[name]
        nd.up = False
        nd.gen += 1

    def restart(self, name: str, join: list[str] | None = None) -> SimNode:
        """Bring a crashed node back with the same name at a new address and an empty state."""
        self.crash(name)
        nd = self._spawn(name)
        now = self.loop.now
        self._run(nd, nd.core.start(now))
        seeds = join or [n for n, o in self.nodes.items() if o.up and n != name][:3]
        self._run(nd, nd.core.join(now, [self.nodes[s].addr for s in seeds]))
        return nd

    def stall(self, name: str, until: float) -> None:
        """The node processes nothing until `until`, then everything queued, late."""
        self.nodes[name].stalled_until = until

    def pause(self, name: str, until: float) -> None:
        """A suspended VM: packets sent to it are lost and its timers wait until `until`."""
        self.nodes[name].paused_until = until
        self.nodes[name].stalled_until = until

    def run_until(self, t: float, stop: Callable[[], bool] | None = None) -> bool:
        return self.loop.run_until(t, stop)

    def run_for(self, dt: float, stop: Callable[[], bool] | None = None) -> bool:
        return self.loop.run_until(self.loop.now + dt, stop)

    def up_nodes(self) -> list[SimNode]:
        return [n for n in self.nodes.values() if n.up]

    def view(self, name: str) -> dict[str, str]:
        """name -> status as `name` sees the cluster."""
        return {m.name: m.status for m in self.nodes[name].core.members.values()}

    # --------------------------------------------------------- execution
    def _run(self, nd: SimNode, effects: list[Any]) -> None:
        loop = self.loop
        for e in effects:
            if isinstance(e, Send):
                for cb in self.on_send:
                    cb(nd, e.addr, e.msg)
                self._deliver(nd, e.addr, Received(nd.addr, e.msg), False, e.msg)
            elif isinstance(e, SetTimer):
                loop.call_at(e.at, self._event, nd, nd.gen, "tick", None)
            elif isinstance(e, SendStream):
                self._deliver(nd, e.addr, StreamReceived(nd.addr, e.msg), True, None)
            elif isinstance(e, Publish):
                for cb in self.on_publish:
                    cb(nd, e)

    def _encoder(self, nd: SimNode) -> Any:
        if nd.encoder is None:
            from kovanex.net.codec import Encoder
            from kovanex.net.keyring import Keyring

            nd.encoder = Encoder(nd.name, 1, Keyring([bytes(32)]), "kovanex")
        return nd.encoder

    def _deliver(self, src: SimNode, addr: Any, ev: Any, reliable: bool, msgs: Any) -> None:
        dst = self.by_addr.get(addr)
        if self.measure_bytes:
            if msgs is not None:
                for pkt in self._encoder(src).encode(msgs):  # the real codec: exact sizes
                    src.bytes_out += len(pkt)
                    src.packets_out += 1
                    src.max_packet = max(src.max_packet, len(pkt))
            else:
                src.stream_bytes_out += PACKET_OVERHEAD + encoded_size(ev.msg)
        if dst is None:
            return
        for d in self.net.fate(src.name, dst.name, reliable):
            self.loop.call_at(self.loop.now + d, self._event, dst, dst.gen, "msg", ev)

    def _event(self, nd: SimNode, gen: int, kind: str, ev: Any) -> None:
        if gen != nd.gen or not nd.up:
            return
        now = self.loop.now
        if kind == "msg" and now < nd.paused_until:
            return
        late = nd.stalled_until
        if kind == "msg" and nd.slow:
            late = max(late, now + nd.slow)  # a message backlog; the node's timers stay on time
        if late > now:
            self.loop.call_at(late, self._event_now, nd, gen, kind, ev)
            return
        self._event_now(nd, gen, kind, ev)

    def _event_now(self, nd: SimNode, gen: int, kind: str, ev: Any) -> None:
        if gen != nd.gen or not nd.up:
            return
        now = self.loop.now
        if kind == "tick":
            self._run(nd, nd.core.tick(now))
        else:
            self._run(nd, nd.core.handle(now, ev))
