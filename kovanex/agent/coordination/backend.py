"""Who leads the cluster, at which term, and may consistent work run here: the coordination
backend behind one small interface (issue 12, ADR 0026).

- `GossipCoordination` (gossip.py): today's behaviour. AP only: no leader among
  several nodes (`status: "uncoordinated"`); a lone node is its own leader at term 1.
- `NatsCoordination`: a supervised `nats-server` child (natsserver.py) forms a JetStream
  cluster with the other SERVER/FULL nodes; the leader lease is a KV key held by
  compare-and-swap. The decisions are the pure deciders' (kovanex/core/leader.py for the
  lease, core/kvtopology.py for routes and the bucket's size); this shell performs their
  effects (CAS writes, heartbeats, routes, stream updates) and feeds the answers back.

Reads (the leader key, node heartbeats) only inform status and the followers' TTL clock;
only a CAS write makes a leader. No lock is held across a NATS call.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from kovanex import config as cfgmod
from kovanex import natsauth
from kovanex.agent.context import NodeContext
from kovanex.agent.coordination.gossip import GossipCoordination
from kovanex.agent.coordination.natsserver import NatsServer
from kovanex.core import kvtopology, leaderstatus, rejoin
from kovanex.core import leader as core
from kovanex.core.decider import Driver
from kovanex.core.effects import SetTimer

log = logging.getLogger("kovanex.coordination")
BUCKET = natsauth.BUCKET
LEADER_KEY = "leader"
RUNS_NATS = kvtopology.RUNS_NATS
MAX_REPLICAS = kvtopology.MAX_REPLICAS  # the bucket's size rule: core/kvtopology.py
BUCKET_WARN_S = 15.0  # no bucket for this long: the reason goes to the log, not just debug
Members = Callable[[], list[dict[str, Any]]]


class Coordination(Protocol):
    backend: str

    async def start(self) -> None: ...
    async def stop(self) -> None: ...
    def meta(self) -> dict[str, Any]: ...
    def status(self) -> dict[str, Any]: ...
    def summary(self) -> dict[str, Any]: ...
    def can_place(self) -> bool: ...
    def leads(self) -> bool: ...
    def set_consistent(self, tasks: frozenset[tuple[str, str]]) -> None: ...


_alive = kvtopology.alive_rows


class NatsCoordination:
    """The JetStream-KV lease, driven by core/leader.py."""

    backend = "nats"

    def __init__(
        self, ctx: NodeContext, members: Members, callbacks: Callbacks | None = None
    ) -> None:
        cb = callbacks if callbacks is not None else Callbacks()
        self.ctx = ctx
        self.members = members
        c = ctx.cfg.coordination
        self.host = cfgmod.parse_addr(ctx.cfg.gossip_bind)[0]
        # the gossip keyring's keys, primary first: client logins derive from them. The
        # server starts with the keys on disk; from then on the live keyring (if given)
        # answers, so `kovanex keys` rotates NATS users too
        keys = natsauth.client_keys(ctx.layout, ctx.cfg)
        self.keys: Callable[[], list[bytes]] = lambda: keys
        self.server: NatsServer | None = None
        if ctx.cfg.role in RUNS_NATS:
            self.server = NatsServer(
                ctx.name, self.host, c, ctx.layout.root, self._auth(), clock=ctx.clock
            )
        if cb.keys is not None:
            self.keys = cb.keys
        self.lease = Driver(
            core.decide, core.LeaderState(ctx.name, c.lease(), since=ctx.clock.monotonic())
        )
        # ADR 0027: keep the KV stream leader off the lease holder's server. Off only for
        # bench/leader_failover_bench.py's "both die together" case.
        step_away = os.environ.get("KOVANEX_NATS_STEP_AWAY", "1") != "0"
        mine = (self.host, c.client_port, c.cluster_port) if self.server is not None else None
        self.topology = Driver(
            kvtopology.decide,
            kvtopology.TopologyState(ctx.name, mine, len(ctx.cfg.join), step_away),
        )
        self.kv: Any = None
        self.nc: Any = None
        self.heartbeats: dict[str, tuple[dict[str, Any], float]] = {}
        # the KV stream's own replication: {replicas, current, leader}; a cut while new
        # replicas still catch up can cost writes (ADR 0045), so `cluster status` shows it
        self.kv_replication: dict[str, Any] | None = None
        self.wake = asyncio.Event()
        self.wake_at = 0.0
        self.tasks: list[asyncio.Task[Any]] = []
        self.on_halt = cb.on_halt
        self.on_resume = cb.on_resume
        self.record = cb.record
        # the ready rule after a heal (core/rejoin.py): a state sync -> (replied, known)
        self.gate = rejoin.Gate()
        self.sync = cb.sync
        self.on_ready = cb.on_ready

    @property
    def state(self) -> core.LeaderState:
        """The lease decider's state (core/leader.py), as the driver holds it."""
        return self.lease.state

    # -- credentials (ADR 0059) -----------------------------------------------------------
    def _auth(self) -> natsauth.ServerAuth:
        name = self.ctx.cfg.coordination.cluster_name
        return natsauth.server_auth(self.ctx.token, self.keys(), name)

    def _login(self) -> natsauth.Login:
        """Asked at every (re)connect, so a key made primary is used from the next one."""
        return self._auth().users[0]

    # -- lifecycle ---------------------------------------------------------------------
    def meta(self) -> dict[str, Any]:
        """Gossip meta: our NATS ports, and the highest term we know (`lease_term`: a
        new KV, e.g. a lone server's turned clustered, starts above it; ADR 0080)."""
        c = self.ctx.cfg.coordination
        out: dict[str, Any] = {"lease_term": self.state.term}
        if self.server is not None:
            out["nats"] = [c.client_port, c.cluster_port]
        return out

    def _peers(self, gone_too: bool = False) -> list[tuple[str, int, int]]:
        """(host, client port, cluster port) of members that run NATS, us included
        (core/kvtopology.py; `gone_too`: dead ones as well, for routes)."""
        return kvtopology.servers(self.topology.state, self.members(), gone_too)

    def _lone(self) -> bool:
        assert self.server is not None
        return kvtopology.lone(self.topology.state, self.members(), self.server.was_clustered)

    async def start(self) -> None:
        if self.server is not None:
            routes = kvtopology.routes(self.topology.state, self.members())
            await self.server.start(routes, solo=self._lone())
        self.tasks = [
            asyncio.create_task(self._connect_and_drive()),
            asyncio.create_task(self._keep_routes()),
        ]

    async def stop(self) -> None:
        for t in self.tasks:
            t.cancel()
        if self.nc is not None:
            try:
                await self.ctx.clock.wait_for(self.nc.close(), 2.0)
            except (TimeoutError, Exception):  # noqa: BLE001 - closing on the way out
                pass
        if self.server is not None:
            await self.server.stop()

    async def _keep_routes(self) -> None:
        while True:
            await self.ctx.clock.sleep(1.0)
            self._topology_changed()
            await self._grow_bucket()

    def _topology_changed(self) -> None:
        """Routes, solo mode and the term floor follow the members (core/kvtopology.py)."""
        srv = self.server
        ev = kvtopology.MembersSeen(
            tuple(self.members()),
            self.state.term,
            solo=srv is not None and srv.solo,
            was_clustered=srv is not None and srv.solo and srv.was_clustered,  # solo only
        )
        for e in self.topology.step(ev, self.ctx.clock.monotonic()):
            if isinstance(e, kvtopology.RaiseFloor):
                self._apply(core.TermSeen(e.term))
            elif isinstance(e, kvtopology.LeaveSolo) and srv is not None:
                log.info("another NATS server joined: leaving solo mode, routes %s",
                         list(e.routes))  # fmt: skip
                self._apply(core.Resign("the lone NATS server restarts clustered"))
                srv.join_cluster(e.routes, self._auth())
            elif isinstance(e, kvtopology.SetRoutes) and srv is not None:
                was = (srv.routes, srv.auth.users)
                if srv.set_routes(e.routes, self._auth()):  # host:port only: no secret
                    if was[0] != srv.routes:
                        log.info("nats routes now %s", sorted(srv.routes))
                    if was[1] != srv.auth.users:
                        log.info("nats users now follow %d gossip key(s)", len(self.keys()))

    def _floor_from_gossip(self) -> None:
        """The highest term any member announces raises our floor (core.TermSeen)."""
        top = kvtopology.floor(self.members())
        if top > self.state.term:
            self._apply(core.TermSeen(top))

    # -- the NATS client ---------------------------------------------------------------
    async def _connect_and_drive(self) -> None:
        import nats

        while self.nc is None:  # the server may not listen yet; a runner may know no server
            own = self.server.client_url if self.server is not None else None
            servers = kvtopology.client_urls(self.topology.state, self.members(), own)
            if not servers:  # never nats-py's default localhost:4222: that is not ours
                await self.ctx.clock.sleep(0.5)
                continue
            try:
                self.nc = await nats.connect(  # the login as arguments, never in a URL
                    servers=servers,
                    user=lambda: self._login().user,
                    password=lambda: self._login().password,
                    reconnected_cb=self._reconnected,
                    connect_timeout=1,
                    max_reconnect_attempts=-1,
                    reconnect_time_wait=0.2,
                    allow_reconnect=True,
                    dont_randomize=self.server is not None,
                    ping_interval=1,
                    max_outstanding_pings=2,
                )
            except Exception as e:  # noqa: BLE001 - no server reachable yet
                log.debug("nats connect: %s", e)
                await self.ctx.clock.sleep(0.5)
        js = self.nc.jetstream(timeout=1.0)
        self.kv = await self._bucket(js)
        self.record("coordination", {"msg": "joined the NATS KV bucket"})
        self.tasks.append(asyncio.create_task(self._read_loop()))
        await self._drive()

    async def _reconnected(self) -> None:
        """After a restart of the server, or a removed key (the server drops that user's
        connections on reload): the login asked for again is the primary's."""
        log.info("nats client connected again as %s", self._login().user)

    async def _bucket(self, js: Any) -> Any:
        """Create or bind the bucket; on a fresh cluster the first create can go unanswered,
        so retry until a quorum answers. We make its stream ourselves, locked
        (natsauth.kv_stream): nats-py's create_key_value allows rollup headers and purges."""
        since = self.ctx.clock.monotonic()
        told = since
        while True:
            try:
                return await js.key_value(BUCKET)
            except Exception:  # noqa: BLE001 - not there yet, or no quorum yet
                pass
            try:
                n = kvtopology.bucket_replicas(self.topology.state, self.members())
                await js.add_stream(natsauth.kv_stream(n))
                return await js.key_value(BUCKET)
            except Exception as e:  # noqa: BLE001
                now = self.ctx.clock.monotonic()
                if now - told >= BUCKET_WARN_S:  # a quorum forms in seconds: say why not
                    told = now
                    log.warning("no KV bucket after %.0fs (%d server(s) known): %r",
                                now - since, len(self._peers()), e)  # fmt: skip
                else:
                    log.debug("bucket not ready: %s", e)
                await self.ctx.clock.sleep(0.5)

    async def _grow_bucket(self) -> None:
        """A bucket made while fewer servers were known gets more replicas as they join."""
        if self.kv is None or self.nc is None or self.server is None:
            return
        from nats.js.errors import NotFoundError

        try:
            js = self.nc.jetstream(timeout=1.0)
            try:
                info = await js.stream_info(f"KV_{BUCKET}")
            except NotFoundError:  # a new cluster (we left solo mode): make it there
                n = kvtopology.bucket_replicas(self.topology.state, self.members())
                info = await js.add_stream(natsauth.kv_stream(n))
                log.info("KV bucket made in the new cluster (%d replicas)", n)
            self.kv_replication = leaderstatus.replication(info)
            ev = kvtopology.StreamSeen(
                tuple(self.members()),
                int(info.config.num_replicas or 1),
                natsauth.locked(info.config),
                info.cluster.leader if info.cluster else None,
                info.cluster is not None and bool(info.cluster.name),  # solo: no name
                core.leads(self.state, self.ctx.clock.monotonic()),
            )
            for e in self.topology.step(ev, self.ctx.clock.monotonic()):
                if isinstance(e, kvtopology.MarkClustered):
                    self.server.mark_clustered()
                elif isinstance(e, kvtopology.UpdateStream):
                    info.config.num_replicas = e.replicas
                    info.config.deny_purge, info.config.allow_rollup_hdrs = True, False
                    await js.update_stream(info.config)
                    log.info("KV bucket: %d replicas, no purge or rollup", e.replicas)
                elif isinstance(e, kvtopology.StepDown):  # keep it off the lease holder
                    await self.nc.request(
                        f"$JS.API.STREAM.LEADER.STEPDOWN.KV_{BUCKET}", b"", timeout=1.0
                    )
        except Exception as e:  # noqa: BLE001 - retried next second
            log.debug("bucket check: %s", e)

    # -- driving the decider -------------------------------------------------------------
    def _apply(self, ev: Any) -> None:
        now = self.ctx.clock.monotonic()
        for e in self.lease.step(ev, now):
            self._execute(e, now)
        self.gate, go = rejoin.step(self.gate, core.has_quorum(self.state, now), now)
        if go:
            self.tasks.append(asyncio.create_task(self._resync(now)))

    async def _resync(self, asked: float) -> None:
        """Quorum back: sync gossip state before placing consistent work (core/rejoin.py)."""
        self.tasks = [t for t in self.tasks if not t.done()]
        try:
            replied, known = await self.sync()
        except Exception as e:  # noqa: BLE001 - counts as no answer; asked again
            log.warning("state sync failed: %s", e)
            replied, known = 0, 2
        # the lease as it is now, before anything is placed: the first write through the
        # quorum can beat the read loop by seconds, and a grant at the term we knew before
        # the cut is refused by every branch the new leader wrote to (StaleTerm)
        for delay in (0.2, 0.5, 1.0, 0.0):  # reads can fail for a moment after a heal
            try:
                rev, lease = await self._read_leader(strict=True)
            except Exception as e:  # noqa: BLE001 - unreachable yet
                if not delay:
                    log.info("the lease is unreadable after the heal (%s); syncing again", e)
                    replied = 0  # not synced: the gate asks again
                    break
                await self.ctx.clock.sleep(delay)
                continue
            if rev:
                self._apply(core.KeySeen(rev, lease))
            break
        was = self.gate
        self.gate = rejoin.synced(self.gate, asked, replied, known)
        if was.lost and not self.gate.lost:
            log.info("state synced with %d of %d members: consistent work may be placed",
                     replied, known - 1)  # fmt: skip
            self.on_ready()
        self.wake.set()

    def _execute(self, e: Any, now: float) -> None:
        if isinstance(e, SetTimer):
            self.wake_at = e.at
        elif isinstance(e, core.Acquire | core.Renew | core.Heartbeat):
            self.tasks.append(asyncio.create_task(self._write(e, now)))
        elif isinstance(e, core.BecameLeader):
            log.info("%s is leader at term %d", self.ctx.name, e.term)
            self.record("leader", {"msg": f"{self.ctx.name} leads at term {e.term}"})
        elif isinstance(e, core.LostLeadership):
            log.warning("lost leadership of term %d: %s", e.term, e.reason)
            self.record("leader", {"msg": f"lost term {e.term}: {e.reason}"})
        elif isinstance(e, core.Halt):
            self.on_halt(e.repo, e.task_id, e.reason)
        elif isinstance(e, core.Resume):
            self.on_resume(e.repo, e.task_id, e.term)

    async def _write(self, e: Any, sent: float) -> None:
        from nats.js.errors import KeyWrongLastSequenceError

        op = {core.Acquire: "acquire", core.Renew: "renew", core.Heartbeat: "heartbeat"}[type(e)]
        try:
            if isinstance(e, core.Heartbeat):
                now = self.ctx.clock.monotonic()
                body = leaderstatus.heartbeat(self.state, now, self._wall())
                rev = await self.kv.put(f"node.{self.ctx.name}", json.dumps(body).encode())
            else:
                value = json.dumps({"holder": e.lease.holder, "term": e.lease.term}).encode()
                if e.last == 0:
                    rev = await self.kv.create(LEADER_KEY, value)
                else:
                    rev = await self.kv.update(LEADER_KEY, value, last=e.last)
            ev = core.CasDone(op, sent, True, rev)
        except KeyWrongLastSequenceError:
            ev = await self._refused(op, sent)
        except Exception as ex:  # noqa: BLE001 - no responders, timeout, reconnecting
            log.debug("%s unavailable: %s", op, ex)
            ev = core.CasDone(op, sent, False, unavailable=True)
        self._apply(ev)
        self.wake.set()

    async def _refused(self, op: str, sent: float) -> core.CasDone:
        """A CAS the backend refused: its answer is the key as it is now. A key that is not
        there (purged, deleted, a stream made anew) is an answer too, `(0, None)`: the
        decider creates it again above its floor (ADR 0079). Only an unreadable key is
        "unavailable"."""
        try:
            rev, lease = await self._read_leader(strict=True)
        except Exception as ex:  # noqa: BLE001 - no responders, timeout
            log.debug("%s refused, and the key is unreadable: %s", op, ex)
            return core.CasDone(op, sent, False, unavailable=True)
        return core.CasDone(op, sent, False, rev, lease)

    async def _read_leader(self, strict: bool = False) -> tuple[int, core.Lease | None]:
        """(revision, lease) of the leader key; (0, None) when it is absent, or unreachable
        unless `strict` (then that raises)."""
        from nats.js.errors import KeyDeletedError, KeyNotFoundError

        try:
            entry = await self.kv.get(LEADER_KEY)
        except (KeyNotFoundError, KeyDeletedError):  # absent, deleted or purged
            return 0, None
        except Exception:  # noqa: BLE001 - unreachable
            if strict:
                raise
            return 0, None
        if entry.value is None or entry.operation in ("DEL", "PURGE"):
            return int(entry.revision or 0), None
        d = json.loads(entry.value)
        return int(entry.revision), core.Lease(str(d["holder"]), int(d["term"]))

    async def _read_loop(self) -> None:
        """Followers' view of the lease and everyone's heartbeats (informational)."""
        period = min(0.25, self.ctx.cfg.coordination.renew_interval_s / 2)
        while True:
            rev, lease = await self._read_leader()
            if rev:
                self._apply(core.KeySeen(rev, lease))
            for m in _alive(self.members(), self.ctx.name):
                try:
                    entry = await self.kv.get(f"node.{m['name']}")
                except Exception:  # noqa: BLE001
                    continue
                if entry.value:
                    self.heartbeats[m["name"]] = (json.loads(entry.value), entry.revision)
            self.wake.set()
            await self.ctx.clock.sleep(period)

    async def _drive(self) -> None:
        self._floor_from_gossip()  # before the first acquire: a new KV starts above it
        self._apply(core.Tick())
        while True:
            delay = max(0.0, self.wake_at - self.ctx.clock.monotonic())
            try:
                await self.ctx.clock.wait_for(self.wake.wait(), min(delay, 0.5))
            except TimeoutError:
                pass
            self.wake.clear()
            self._floor_from_gossip()
            self._apply(core.Tick())

    # -- queries -------------------------------------------------------------------------
    def _wall(self) -> float:
        return round(self.ctx.clock.time(), 3)

    def can_place(self) -> bool:
        now = self.ctx.clock.monotonic()
        synced = rejoin.ready(self.gate, core.has_quorum(self.state, now))
        return synced and core.can_place(self.state, now)

    def leads(self) -> bool:
        """We hold an unexpired lease: the single-decider decisions are ours (ADR 0036)."""
        return core.leads(self.state, self.ctx.clock.monotonic())

    def set_consistent(self, tasks: frozenset[tuple[str, str]]) -> None:
        if tasks != self.state.consistent:
            self._apply(core.TasksRunning(tasks))

    def summary(self) -> dict[str, Any]:
        """For `kovanex status`: it answers before a quorum exists and says so."""
        return leaderstatus.summary(self.state, self.ctx.clock.monotonic(), len(self._peers()))

    def status(self) -> dict[str, Any]:
        return leaderstatus.status(
            self.state,
            self.ctx.clock.monotonic(),
            self._wall(),
            _alive(self.members(), self.ctx.name),
            self.heartbeats,
            len(self._peers()),
            self.kv_replication,
        )


async def _lone() -> tuple[int, int]:
    return 0, 1  # not wired (a lone node): nothing to sync with


@dataclass(frozen=True)
class Callbacks:
    """What the NATS backend tells the agent, given at construction (ADR 0107). The
    gossip backend holds no lease, so it calls none of them."""

    keys: Callable[[], list[bytes]] | None = None  # the live gossip keyring's keys
    on_halt: Callable[[str, str, str], None] = lambda repo, task, why: None
    on_resume: Callable[[str, str, int], None] = lambda repo, task, term: None
    record: Callable[[str, dict[str, Any]], None] = lambda kind, data: None
    sync: Callable[[], Awaitable[tuple[int, int]]] = _lone  # the state sync after a heal
    on_ready: Callable[[], None] = lambda: None  # synced: what waited may be placed


def make(ctx: NodeContext, members: Members, callbacks: Callbacks | None = None) -> Coordination:
    if ctx.cfg.coordination.backend == "nats":
        return NatsCoordination(ctx, members, callbacks)
    return GossipCoordination(ctx, members)
