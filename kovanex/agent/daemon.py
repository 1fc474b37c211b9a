"""The node agent, wired in one place: hooks hand it pushes; it queues, places and runs
tasks, replicates repos and takes over the leases and repos of failed nodes.

The agent is a composition of small services, each owning its state (see
docs/ARCHITECTURE.md); the decisions are the pure cores' in `kovanex/core/`. Git is
the state: memory only caches what the refs say, so a restart (or `kill -9`) loses
nothing. On start every task ref is read again and the work continues.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from kovanex import config as cfgmod
from kovanex import nodemodules as modules
from kovanex.agent.assignments import Assignments
from kovanex.agent.cluster import Cluster, load_keyring
from kovanex.agent.context import NodeContext
from kovanex.agent.control import ControlServer
from kovanex.agent.coordination import backend as coordination
from kovanex.agent.deadline import PlacementDeadline
from kovanex.agent.dispatch import Dispatcher, Sweeper
from kovanex.agent.executor import kill_orphan
from kovanex.agent.failover import Failover
from kovanex.agent.halting import ConsistentWork
from kovanex.agent.healthsvc import HealthService
from kovanex.agent.heaptrim import IdleTrim
from kovanex.agent.hookserver import HookServer
from kovanex.agent.leaderwork import LeaderWork
from kovanex.agent.metrics import Metrics
from kovanex.agent.ops import ControlOps
from kovanex.agent.placement import LocalNode, Placer
from kovanex.agent.promotions import Promotions
from kovanex.agent.pushes import PushHandler
from kovanex.agent.remoterun import RemoteRuns
from kovanex.agent.replication.manager import ReplicaManager
from kovanex.agent.repos import RepoIndex
from kovanex.agent.runs import RunTable
from kovanex.agent.scaling import ScalingService
from kovanex.agent.scheduling import TaskLocks, TaskScheduler
from kovanex.agent.serverplace import ServerPlacement
from kovanex.agent.stopping import RUNS_TIMEOUT_S, STEP_TIMEOUT_S, StopWatch, bounded
from kovanex.agent.tokensync import TokenSync
from kovanex.agent.upkeep import UpkeepService, release_memory
from kovanex.agent.watcher import RefWatcher
from kovanex.api.feeds import ApiFeeds
from kovanex.clock import SYSTEM, Clock, settled
from kovanex.core.netpolicy import NodePorts, node_ports, parse_egress
from kovanex.gitstate import gitcli
from kovanex.net.githttp import GitHttpServer, Router
from kovanex.net.gossip import MemberInfo
from kovanex.net.transport import Transport
from kovanex.paths import install_hooks
from kovanex.runner import netpolicy, units
from kovanex.runner.limits import reap_stale
from kovanex.tokens import TokenBook

log = logging.getLogger("kovanex.agent")


def prepare_repo(path: Path, data_dir: Path, pack_bytes: int) -> None:
    """A replica the agent makes: hooks, and git's bound on a push's pack (limits.pack_bytes)."""
    install_hooks(path, data_dir)
    gitcli.ensure_repo_config(path, pack_bytes)


Front = Callable[["Agent"], Router]


class Agent:
    """Builds the services and connects them; `run` starts and stops them in order.

    `front` builds what serves /v1 and /ui/ on the HTTP listener over the finished
    services (kovanex/node.py: the API and the dashboard sit above the agent, issue 25)."""

    def __init__(
        self,
        layout: cfgmod.Layout,
        cfg: cfgmod.NodeConfig,
        front: Front | None = None,
        *,
        clock: Clock = SYSTEM,
        transport: Transport | None = None,
        owns_process: bool = True,
    ) -> None:
        """`clock`, `transport` (gossip's) and `owns_process` are seams: the in-process
        cluster of kovanex/simreal/cluster.py runs several agents in one process over a
        MemoryNetwork (issue 25 part 3, ADR 0110). An agent that does not own its process
        installs no SIGTERM/SIGINT handlers and its stop watchdog never exits the
        process. The defaults are the daemon's."""
        # Each service gets its collaborators in its constructor, built in dependency
        # order. Where a service must call one built after it (a true cycle: the runs
        # report tips to the scheduler that needs the runs), it gets a relay, a lambda
        # over this composition root resolved at call time; nothing calls one before
        # `run`, and nothing is assigned into a service afterwards (ADR 0107,
        # tests/test_wiring.py).
        ctx = self.ctx = NodeContext(layout, cfg, cfgmod.read_token(layout), clock)
        self.owns_process = owns_process
        self.started = ctx.clock.time()
        self.url = ""  # this node's HTTP base URL, once its listener is bound (_start)
        self.repos = RepoIndex(layout, cfg.name, roles=lambda: self.replicas)
        self.runs = RunTable(
            ctx,
            on_tip=lambda repo, task, tip: self.scheduler.saw_tip(repo, task, tip),
            on_finished=self._ran,
        )
        self.heap = IdleTrim(
            lambda: bool(self.runs.runs), clock=ctx.clock
        )  # freed heap back when idle
        self.network = netpolicy.for_node(  # closes the node's own ports to its units
            units.unit_key(cfg),
            [u.uid for u in self.runs.units],
            parse_egress(cfg.units_egress),
            self.runs.isolation,
        )
        self.locks = TaskLocks()
        self.placer = Placer(
            lambda: [
                replace(self.local.info(), cordoned=self.cluster.cordoned),
                *self.cluster.node_infos(cordoned_too=True),
            ],
            self.repos.ledger,
            lambda: ctx.cfg.strategy,
            clock=ctx.clock,
            lapse_base=lambda: self.cluster.node.profile.placement_deadline,
        )
        self.server_placement = ServerPlacement(
            ctx, self.placer, self.repos, lambda: self.cluster.members()
        )
        self.health = HealthService(
            layout.root,
            runner_total_fn=lambda: self.runs.slots.total,
            runner_free_fn=lambda: self.runs.slots.free,
            queue_depth_fn=lambda: len(self.scheduler.pending),
            clock=ctx.clock,
        )
        self.ops = ControlOps(self)  # the request surface; it reads the services below
        self.book = TokenBook(layout.tokens_file)
        self.local = LocalNode(ctx, self.runs, self.repos, self.health.score)
        keyring = load_keyring(layout, cfg)  # gossip's, and NATS users derive from it
        self.coord = coordination.make(
            ctx,
            lambda: self.cluster.members(),
            coordination.Callbacks(
                keys=keyring.keys,  # `kovanex keys` rotates NATS users too
                on_halt=lambda repo, task, why: self.consistent.halt(repo, task, why),
                on_resume=lambda repo, task, term: self.consistent.resume(repo, task, term),
                record=lambda kind, data: self.cluster.record(kind, data),
                sync=lambda: self.leader.resync(),
                on_ready=self._synced,
            ),
        )
        nats = isinstance(self.coord, coordination.NatsCoordination)
        self.consistent = ConsistentWork(
            ctx,
            self.coord,
            self.repos,
            self.runs,
            self.locks,
            kick=lambda: self.dispatcher.changed("", ""),
            hand_back=(
                (lambda repo, task, epoch, why: self.remote.hand_back(repo, task, epoch, why))
                if nats
                else None
            ),
        )
        # before the gossip member: its first meta samples health, which reads the queue
        self.scheduler = TaskScheduler(
            ctx,
            self.repos,
            self.runs,
            self.placer,
            self.server_placement,
            self.locks,
            watch_lease=lambda key, view: self.deadline.watch(key, view),
            announce=lambda a: self.assignments.announce(a),
            kick=lambda repo: self.dispatcher.changed(repo),
            can_place_remotely=lambda: bool(self.cluster.node_infos()),
            on_placed=lambda seconds: self.metrics.placed(seconds),
            lease_over=lambda repo, view: self.assignments.retract(repo, view),
            grant=self.consistent.grant,
        )
        self.cluster = Cluster(
            ctx,
            self.local,
            self.http_url,
            self._on_member_event,
            keyring=keyring,
            extra_meta=self.coord.meta,
            on_record=lambda event: self.feeds.recorded(event),
            transport=transport,
        )
        gossip = self.cluster.node
        self.assignments = Assignments(cfg.name, gossip, self.http_url)
        self.leader = LeaderWork(self, requeued=self._requeued)  # grants (ADR 0036)
        self.deadline = PlacementDeadline(
            ctx,
            self.repos,
            self.placer,
            self.locks,
            gossip,
            requeued=self._requeued,
            record=self.cluster.record,
        )
        self.failover = Failover(
            ctx,
            self.repos,
            self.locks,
            gossip,
            requeued=self._requeued,
            changed=lambda: self.dispatcher.changed("", ""),
            record=self.cluster.record,
            tracked=lambda: list(self.scheduler.active),
            leader_decides=self.leader.decides_task if nats else lambda repo, task: False,
        )
        self.replicas = ReplicaManager(
            node_name=cfg.name,
            repos_dir=layout.repos,
            gossip=gossip,
            token=ctx.token,
            http_url=self.http_url,
            install_hooks=lambda path: self._copy_made(path, layout.root, cfg.limits.pack_bytes),
            on_owned=self._on_owned,
            clock=ctx.clock,
            broken=self.repos.broken,  # one record of the broken repos
            leader_decides=self.leader.decides_repo if nats else lambda repo: False,
            on_demoted=lambda repo, owner: self.remote.demoted(repo, owner),
        )
        self.remote = RemoteRuns(ctx, self.runs, self.locks, self.deadline, gossip, self.replicas)
        self.dispatcher = Dispatcher(self.repos, self.scheduler, self.replicas, clock=ctx.clock)
        self.upkeep = UpkeepService(
            ctx,
            self.repos,
            self._archived,
            layout.upkeep_file,
            quiet=self._unwatch,
            loud=self._rewatch,
        )
        self.sweeper = Sweeper(
            self.repos,
            self.scheduler,
            self.watch,
            self.failover.fence_failed_holders,
            clock=ctx.clock,
            busy=lambda repo: repo in self.upkeep.rewriting,
        )
        self.scaling = ScalingService(
            ctx,
            pending=lambda: len(self.scheduler.pending),
            members=self.cluster.members,
            local_free=lambda: self.runs.slots.free,
            health=lambda: self.cluster.node.items("health"),
            on_decision=lambda d: self.cluster.record(
                "scale", {**d["recommendation"], "applied": bool(d.get("applied"))}
            ),
        )
        # the API's event feeds (kovanex/api/feeds.py); its router is built by `front`
        self.feeds = ApiFeeds(self.repos.ledger, self.repos.all(), self.scaling.decision)
        self.promotions = Promotions(
            ctx,
            self.repos,
            self.replicas,
            self.dispatcher.changed,
            self.cluster.members,
            term=self._term if nats else lambda: 0,
            on_change=self.feeds.promoted,
        )
        self.pushes = PushHandler(
            ctx,
            self.repos,
            self.placer,
            self.scheduler,
            self.dispatcher,
            self.replicas,
            self.remote.owner_desc,
            self.watch,
            on_release=self.promotions.on_push,
            quorum=self.coord.can_place if nats else None,
        )
        self.token_sync = TokenSync(self.book, gossip)
        self.metrics = Metrics(
            ctx,
            self.cluster,
            self.runs,
            self.scheduler,
            self.repos,
            self.replicas,
            self.health,
            self.scaling,
            leader_term=(lambda: self.coord.summary()["term"] or None) if nats else lambda: None,
        )
        self.hooks = HookServer(
            layout.hook_endpoint, self.metrics.events.timed(self.pushes.on_hook), clock=ctx.clock
        )
        self.feeds.hub.subscribe(self.metrics.events.on_event)
        self.control = ControlServer(layout.control_socket, self.ops.on_control)
        self.watcher: RefWatcher | None = None
        host, port = cfgmod.parse_addr(cfg.http_bind, 0)
        self.http = GitHttpServer(  # last: /ui/ pages, then /v1, over the finished services
            layout.repos,
            ctx.token,
            bind=(host, port),
            api=self.ops.http_api,
            users=self.book,
            router=front(self) if front is not None else None,
            internal=self.replicas.wire,  # replication's fetch/stage endpoints
            clock=ctx.clock,
        )

    def _term(self) -> int | None:
        """The leader's term for a promotion's commits; None without a quorum."""
        return int(self.coord.summary()["term"]) if self.coord.can_place() else None

    # -- wiring helpers ----------------------------------------------------------------
    def _ran(self, repo: str, task_id: str) -> None:
        self.dispatcher.ran(repo, task_id)
        self.remote.ran(repo, task_id)
        if not self.runs.runs:
            self.heap.idle()

    def _synced(self) -> None:
        """State synced after a quorum loss (core/rejoin.py): place what waited, and start
        what an owner assigned us while our owner records were stale."""
        self.consistent.synced()
        self.remote.recheck()

    def http_url(self) -> str:
        return self.url

    def watch(self, repo: str) -> None:
        if self.watcher is not None:
            self.watcher.watch(self.repos.path(repo))

    def _unwatch(self, repo: str) -> None:
        if self.watcher is not None:
            self.watcher.pause(self.repos.path(repo))

    def _rewatch(self, repo: str) -> None:
        """After the agent's own bulk ref rewrite: watch again, and read the repo once
        (anything another hand moved meanwhile, and the replicas' announcement). The API's
        task events came from the watcher too: the tasks in flight are looked at again
        (it publishes only those whose state moved)."""
        self.watch(repo)
        self.dispatcher.changed(repo)
        for r, task_id in sorted(self.scheduler.active):
            if r == repo:
                self.feeds.ref_moved(repo, task_id)

    def _ref_moved(self, repo: str, task_id: str | None = None) -> None:
        self.dispatcher.ref_moved(repo, task_id)
        self.feeds.ref_moved(repo, task_id)
        self.promotions.kick(repo)  # a gate task may have finished

    def _archived(self, key: tuple[str, str]) -> None:
        self.scheduler.forget(key)
        self.placer.forget(key)
        self.feeds.tasks.forget(key)

    def _requeued(self, repo: str, task_id: str) -> None:
        self.scheduler.after_write(repo, task_id)
        self.dispatcher.changed("", "")  # a placement pass

    def _on_member_event(self, topic: str, member: MemberInfo) -> None:
        if topic == "member-join":  # it may have missed our assignments while away
            self.assignments.rejoined(member.name)
        self.failover.on_member_event(topic, member)

    def _copy_made(self, path: Path, root: Path, pack_bytes: int) -> None:
        """A replica's bare repo was just made here: its hooks go in, and the repo index
        lists it now, so a read of it is answered from this copy; until the next sweep it
        was forwarded to the owner, which may be the node that just stopped answering
        (the read then hung for the forward's 30 s)."""
        prepare_repo(path, root, pack_bytes)
        self.repos.refresh()

    def _on_owned(self, repo: str) -> None:
        """We took over a repo (its owner failed): adopt its tasks under our ownership."""
        self.repos.refresh()
        self.watch(repo)
        log.info("took over ownership of %s", repo)
        self.cluster.record("ownership", {"repo": repo, "msg": f"{self.ctx.name} is now owner"})

        async def adopt() -> None:
            self.repos.forget_ledger(repo)  # refs were promoted underneath any cached view
            await self.scheduler.reconcile_repo(repo, force=True)
            await self.failover.fence_failed_holders()
            await self.scheduler.schedule_pending()

        asyncio.get_running_loop().create_task(adopt())

    def node_ports(self) -> NodePorts:
        """The listeners of this node that its units must not reach (ADR 0076)."""
        co = self.ctx.cfg.coordination
        nats = (co.client_port, co.cluster_port) if co.backend == "nats" else None
        # the hook port is bound before the rules are applied (HookServer.bind); gossip's
        # is 0 until gossip has started
        return node_ports(nats, self.hooks.port, self.cluster.node.addr[1], self.http.port)

    async def _enforce_network(self) -> None:
        await asyncio.to_thread(self.network.apply, self.node_ports())

    # -- lifecycle ---------------------------------------------------------------------
    async def run(self, on_ready: Callable[[], None] | None = None) -> None:
        """Start, serve until asked to stop, stop: all within 10 s of SIGTERM, even when
        the stop comes mid-start or a service will not close (kovanex/agent/stopping.py)."""
        ctx = self.ctx
        loop = asyncio.get_running_loop()
        watch = StopWatch(ctx.name, clock=ctx.clock, hard_exit=self.owns_process)

        def asked() -> None:
            watch.arm()
            ctx.stop_event.set()

        for sig in (signal.SIGTERM, signal.SIGINT) if self.owns_process else ():
            loop.add_signal_handler(sig, asked)
        starting = asyncio.create_task(self._start(on_ready))
        stop = asyncio.create_task(ctx.stop_event.wait())
        await asyncio.wait({starting, stop}, return_when=asyncio.FIRST_COMPLETED)
        workers: list[asyncio.Task[Any]] = []
        failed: BaseException | None = None
        if not starting.done():
            log.warning("agent %s asked to stop while starting; start-up abandoned", ctx.name)
            starting.cancel()
            await settled(ctx.clock, {starting}, STEP_TIMEOUT_S)
        elif starting.exception() is not None:
            failed = starting.exception()
            log.error("agent %s failed to start: %r; stopping", ctx.name, failed)
        else:
            workers = starting.result()
            await stop  # serving: the workers and listeners do the work from here
        watch.arm()  # LeaveCluster and a failed start stop on time too
        stop.cancel()
        log.info("agent %s stopping", ctx.name)
        await self._stop(watch, workers)
        # still armed: the default executor's threads are joined after this returns, and
        # one stuck in a hung child must not keep the process (the timer is a daemon)
        if failed is not None:
            raise failed

    async def _start(self, on_ready: Callable[[], None] | None) -> list[asyncio.Task[Any]]:
        ctx, layout = self.ctx, self.ctx.layout
        loop = asyncio.get_running_loop()
        layout.run.mkdir(parents=True, exist_ok=True)
        self.watcher = RefWatcher(layout.repos, loop, self._ref_moved)
        for repo in self.repos.all():
            self.watch(repo)
            # repos made by older versions; the pack bound follows this node's [limits]
            gitcli.ensure_repo_config(self.repos.path(repo), ctx.cfg.limits.pack_bytes)
        self.watcher.start()
        await self.control.start()
        modules.load_modules(ctx.cfg.modules)  # a bad [[modules]] fails here, clearly
        # Nothing runs yet, so every step pidfile left behind belongs to an orphan of a
        # killed agent: local or remote task alike, it must die before anyone resumes it.
        steps_dir = layout.run / "steps"
        for pidfile in sorted(steps_dir.glob("*.json")) if steps_dir.exists() else []:
            if kill_orphan(pidfile):
                log.info("killed an orphaned step from before the restart (%s)", pidfile.stem)
        await reap_stale()  # step cgroups left by a previous agent that was killed
        await self.http.start()
        self.url = self.http.url  # gossip meta and the replicas' peers ask for it
        await self.cluster.start()
        self.hooks.bind()  # its port, served later, is closed to units with the rest
        await self._enforce_network()  # before any step can run
        self.feeds.start()  # its scale poller reads gossip: only once gossip has started
        await self.coord.start()  # never waits for a quorum: status answers before one
        self.token_sync.start()
        self.remote.start()
        self.deadline.start()
        await self.replicas.start()
        for repo in self.repos.all():
            self.watch(repo)
        await self.scheduler.reconcile_all()
        release_memory()  # one pass over every task's tip: do not carry its peak
        await self.hooks.start()
        layout.pid_file.write_text(f"{os.getpid()}\n")
        workers = [
            asyncio.create_task(self.sweeper.run()),
            asyncio.create_task(self.dispatcher.run()),
            asyncio.create_task(
                self.cluster.keep_fresh(
                    lambda: (self.repos.owned(), self.repos.replicas()),
                    lambda: (self.health.vector(), self.health.score()),
                )
            ),
            asyncio.create_task(self.health.run(ctx.stop_event)),
            asyncio.create_task(self.failover.probe_suspects()),
            asyncio.create_task(self.deadline.guard()),
            asyncio.create_task(self.scaling.run(ctx.stop_event)),
            asyncio.create_task(self.upkeep.run()),
            asyncio.create_task(self.consistent.watch()),
            asyncio.create_task(self.promotions.run()),
            *self.leader.start(),
        ]
        log.info("agent %s ready (hook port %d)", ctx.name, self.hooks.port)
        if on_ready:
            on_ready()
        return workers

    async def _stop(self, watch: StopWatch, workers: list[asyncio.Task[Any]]) -> None:
        """Close every service, each under its own timeout, in the order that lets the
        runs stand down first and the listeners (event streams included) go last."""
        t = STEP_TIMEOUT_S
        await bounded(watch, "hooks", self.hooks.close(), t)
        self.heap.cancel()
        for w in workers:
            w.cancel()
        await bounded(watch, "runs", self.runs.stop(RUNS_TIMEOUT_S), RUNS_TIMEOUT_S + 0.5)
        await bounded(watch, "network", asyncio.to_thread(self.network.remove), t)
        await bounded(watch, "scaling", self.scaling.stop(), t)
        if getattr(self, "watcher", None) is not None:
            self.watcher.stop()
        await bounded(watch, "replication", self.replicas.stop(), t)
        await bounded(watch, "coordination", self.coord.stop(), t)
        await bounded(watch, "gossip", self.cluster.stop(graceful=self.ctx.leaving), t)
        await bounded(watch, "http", self.http.close(), t)
        await bounded(watch, "api", self.feeds.stop(), t)
        await bounded(watch, "control", self.control.close(), t)
        self.ctx.layout.pid_file.unlink(missing_ok=True)
        watch.stopped()
