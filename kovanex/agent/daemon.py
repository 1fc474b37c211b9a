"""The node agent: hooks hand it pushes; it queues, places and runs tasks.

Git is the state. The agent's memory only caches what the refs say, so a
restart (or `kill -9`) loses nothing: on start it re-reads every task ref and
continues. A watchdog watcher plus a periodic sweep catch ref changes that
bypassed the hooks.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kovanex import config as cfgmod
from kovanex import nodemodules as modules
from kovanex import spec as specmod
from kovanex.agent.cluster import Cluster
from kovanex.agent.control import ControlServer
from kovanex.agent.executor import Lease, TaskRun, kill_orphan
from kovanex.agent.failover import START_FAILED, Failover
from kovanex.agent.healthsvc import HealthService
from kovanex.agent.hookserver import HookRequest, HookServer
from kovanex.agent.ops import ControlOps
from kovanex.agent.placement import Placer, request_of
from kovanex.agent.replica import ReplicaManager
from kovanex.agent.serverplace import ServerPlacement
from kovanex.agent.tokensync import TokenSync
from kovanex.agent.watcher import RefWatcher
from kovanex.core import startwatch
from kovanex.core import task as taskcore
from kovanex.gitstate.ledger import AlreadyClaimed, TaskLedger, task_id_of
from kovanex.gitstate.pygit2store import Pygit2Store
from kovanex.gitstate.store import CasConflict, StaleEpoch
from kovanex.net.githttp import GitHttpServer
from kovanex.paths import install_hooks
from kovanex.pushcheck import (
    ZERO,
    PushOptions,
    RefUpdate,
    check_pre_receive,
    is_skipped,
    queue_submission,
    record_push,
)
from kovanex.runner import RunnerSlots, units
from kovanex.runner.limits import reap_stale
from kovanex.tokens import TokenBook

log = logging.getLogger("kovanex.agent")
# Anti-entropy sweep interval; KOVANEX_SWEEP_S overrides it (tests raise it to prove the
# watcher alone notices ref writes that bypass the hooks).
SWEEP_S = float(os.environ.get("KOVANEX_SWEEP_S", "5.0"))
SETTLE_S = 0.02

Key = tuple[str, str]


class Agent(ControlOps, Failover):
    def __init__(self, layout: cfgmod.Layout, cfg: cfgmod.NodeConfig) -> None:
        self.layout = layout
        self.cfg = cfg
        self.node = cfg.name
        self.slots = RunnerSlots(cfg.runner_slots if cfg.role in ("full", "runner") else 0)
        self.units, self.isolation = units.start(cfg)  # runner slot n runs as units[n]
        self.runs: dict[Key, TaskRun] = {}
        self.tips: dict[Key, str] = {}
        self.locks: dict[Key, asyncio.Lock] = {}
        # queued tasks waiting for placement: key -> (tip, priority); read once per tip so
        # scheduling stays O(pending) per pass instead of re-walking every history
        self.pending: dict[Key, tuple[str, int]] = {}
        self.ledgers: dict[str, TaskLedger] = {}
        self.placer = Placer(self)
        self.server_placement = ServerPlacement(self)
        self.stop_event = asyncio.Event()
        self.started = time.time()
        self.extra_ops: dict[str, Callable[[dict[str, Any]], Any]] = {}
        # repo -> task ids whose refs moved (None: scan the whole repo, e.g. packed-refs)
        self._dirty: dict[str, set[str] | None] = {}
        self._repos: list[str] | None = None
        self._announce: set[str] = set()
        self.leaving = False
        self._kick: asyncio.Event | None = None
        self.health: Any = None
        self.cluster: Cluster | None = None
        self.http: GitHttpServer | None = None
        self.token = cfgmod.read_token(layout)
        self.remote_exec = True
        self.replicas: Any = None
        self.assignments: dict[
            str, str
        ] = {}  # repo -> owner base URL, from assign records  # remote runs fetch from and CAS-push to the owner over HTTP
        # push options seen at pre-receive, keyed by (repo, task, new oid): the watchdog may
        # notice the ref move before post-receive arrives, and must still honour them.
        self.push_opts: dict[tuple[str, str, str], PushOptions] = {}
        # placed leases waiting to be started, with the owner's clock (ADR 0012)
        self.lease_watches: dict[Key, startwatch.Watch] = {}
        self.start_failures: dict[Key, startwatch.StartFailure] = {}
        self._lease_kick = asyncio.Event()

    # -- repos and ledgers -------------------------------------------------------------
    def repo_path(self, repo: str) -> Path:
        return self.layout.repo(repo)

    def repos(self) -> list[str]:
        """Cached: a glob per wake-up showed up in profiles; refresh_repos() on changes."""
        if self._repos is None:
            self.refresh_repos()
        return list(self._repos or [])

    def refresh_repos(self) -> list[str]:
        if not self.layout.repos.exists():
            self._repos = []
        else:
            self._repos = sorted(p.name[:-4] for p in self.layout.repos.glob("*.git") if p.is_dir())
        return list(self._repos)

    def ledger(self, repo: str) -> TaskLedger:
        led = self.ledgers.get(repo)
        if led is None:
            led = TaskLedger(Pygit2Store(str(self.repo_path(repo))), node=self.node)
            self.ledgers[repo] = led
        return led

    def health_score(self) -> float:
        return 1.0 if self.health is None else self.health.score()

    def capabilities(self) -> set[str]:
        return modules.capabilities(self.cfg)

    def http_url(self) -> str:
        return self.http.url if self.http is not None else ""

    def remote_nodes(self) -> list:
        """Other members' NodeInfo from gossip; only once they can run our repos' tasks."""
        if self.cluster is None or not self.remote_exec:
            return []
        return self.cluster.node_infos()

    def _on_owned(self, repo: str) -> None:
        """We took over a repo (its owner failed): adopt its tasks under our ownership."""
        self.refresh_repos()
        self.watcher.watch(self.repo_path(repo))
        log.info("took over ownership of %s", repo)
        if self.cluster is not None:
            self.cluster.record("ownership", {"repo": repo, "msg": f"{self.node} is now owner"})

        async def adopt() -> None:
            self.ledgers.pop(repo, None)  # refs were promoted underneath any cached view
            await self.reconcile_repo(repo, force=True)
            await self._fence_dead_holders()
            await self.schedule_pending()

        asyncio.get_running_loop().create_task(adopt())

    def replica_repos(self) -> list[str]:
        if self.replicas is None:
            return []
        return [r for r in self.repos() if self.replicas.is_replica(r)]

    def owned_repos(self) -> list[str]:
        if self.replicas is None:
            return self.repos()
        return [r for r in self.repos() if self.replicas.is_owner(r)]

    def saw_tip(self, repo: str, task_id: str, tip: str) -> None:
        self.tips[(repo, task_id)] = tip

    # -- lifecycle ---------------------------------------------------------------------
    async def run(self, on_ready: Callable[[], None] | None = None) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stop_event.set)
        self.layout.run.mkdir(parents=True, exist_ok=True)
        self._kick = asyncio.Event()
        self.watcher = RefWatcher(self.layout.repos, loop, self._on_ref_change)
        for repo in self.repos():
            self.watcher.watch(self.repo_path(repo))
        self.watcher.start()
        self.hooks = HookServer(self.layout.hook_endpoint, self._on_hook)
        self.control = ControlServer(self.layout.control_socket, self._on_control)
        await self.control.start()
        modules.load_modules(self.cfg.modules)  # a bad [[modules]] fails here, clearly
        # Nothing runs yet, so every step pidfile left behind belongs to an orphan of a
        # killed agent: local or remote task alike, it must die before anyone resumes it.
        steps_dir = self.layout.run / "steps"
        for pidfile in sorted(steps_dir.glob("*.json")) if steps_dir.exists() else []:
            if kill_orphan(pidfile):
                log.info("killed an orphaned step from before the restart (%s)", pidfile.stem)
        await reap_stale()  # step cgroups left by a previous agent that was killed
        self.health = HealthService(
            self.layout.root,
            runner_total_fn=lambda: self.slots.total,
            runner_free_fn=lambda: self.slots.free,
            queue_depth_fn=lambda: len(self.pending),
        )
        host, port = cfgmod.parse_addr(self.cfg.http_bind, 0)
        book = TokenBook(self.layout.tokens_file)
        self.http = GitHttpServer(
            self.layout.repos,
            self.token,
            bind=(host, port),
            api=self._http_api,
            users=book,
        )
        await self.http.start()
        self.cluster = Cluster(self)
        await self.cluster.start()
        self.token_sync = TokenSync(book, self.cluster.node)
        self.token_sync.start()
        self.cluster.node.subscribe("assign", self._on_assign)
        self.cluster.node.subscribe(START_FAILED, self._on_start_failed)
        self.replicas = ReplicaManager(
            node_name=self.node,
            repos_dir=self.layout.repos,
            gossip=self.cluster.node,
            token=self.token,
            http_url=self.http_url,
            install_hooks=lambda path: install_hooks(path, self.layout.root),
            on_owned=self._on_owned,
        )
        await self.replicas.start()
        await self.reconcile_all()
        await self.hooks.start()
        self.layout.pid_file.write_text(f"{os.getpid()}\n")
        workers = [
            asyncio.create_task(self._sweeper()),
            asyncio.create_task(self._dispatcher()),
            asyncio.create_task(self._gossip_refresher()),
            asyncio.create_task(self.health.run(self.stop_event)),
            asyncio.create_task(self._lease_guard()),
            asyncio.create_task(self._placement_guard()),
        ]
        log.info("agent %s ready (hook port %d)", self.node, self.hooks.port)
        if on_ready:
            on_ready()
        await self.stop_event.wait()
        log.info("agent %s stopping", self.node)
        await self.hooks.close()
        for run in list(self.runs.values()):
            run.stand_down("agent stopping; the task resumes when an agent restarts")
        for w in workers:
            w.cancel()
        if self.runs:
            await asyncio.wait(
                [asyncio.create_task(asyncio.sleep(0))]
                + [asyncio.create_task(self._wait_run(k)) for k in list(self.runs)],
                timeout=10,
            )
        self.watcher.stop()
        await self.replicas.stop()
        await self.cluster.stop(graceful=self.leaving)
        await self.http.close()
        await self.control.close()
        self.layout.pid_file.unlink(missing_ok=True)

    async def _wait_run(self, key: Key) -> None:
        while key in self.runs:
            await asyncio.sleep(0.05)

    async def _sweeper(self) -> None:
        """Anti-entropy: a periodic full read of the refs catches anything missed."""
        while True:
            await asyncio.sleep(SWEEP_S)
            try:
                for repo in self.refresh_repos():
                    self.watcher.watch(self.repo_path(repo))
                for repo in self.owned_repos():
                    await self.reconcile_repo(repo)
                await self._fence_dead_holders()
                await self.schedule_pending()
            except Exception:
                log.exception("sweep failed")

    async def _gossip_refresher(self) -> None:
        """Keep meta (slots, health) and the repo inventory current on gossip."""
        assert self.cluster is not None
        last_repos: tuple[list[str], list[str]] | None = None
        while True:
            self.cluster.refresh()
            inventory = (self.owned_repos(), self.replica_repos())
            if inventory != last_repos:
                self.cluster.publish_repos(*inventory)
                last_repos = inventory
            if self.health is not None:
                self.cluster.publish_health(self.health.vector(), self.health.score())
            await asyncio.sleep(1.0)

    async def _dispatcher(self) -> None:
        """Coalesce ref-change notifications and slot releases into reconciles."""
        assert self._kick is not None
        while True:
            await self._kick.wait()
            # A short settle window: a push's ref move wakes us while git is still
            # finishing that push; on 2 cores, starting the task at once slows the push
            # itself. It also coalesces bursts (an atomic push of many branches).
            await asyncio.sleep(SETTLE_S)
            self._kick.clear()
            dirty, self._dirty = self._dirty, {}
            announce, self._announce = self._announce, set()
            owned = set(self.owned_repos())
            if self.replicas is not None:
                for repo in sorted(announce - set(dirty)):
                    if repo in owned and self.replicas.has_replicas(repo):
                        self.replicas.refs_changed(repo)
                        self.replicas.nudge_replicas(repo)
            for repo, tasks in sorted(dirty.items()):
                if repo not in owned:
                    continue
                if self.replicas is not None and self.replicas.has_replicas(repo):
                    self.replicas.refs_changed(repo)
                    self.replicas.nudge_replicas(repo)
                if tasks is None:
                    await self.reconcile_repo(repo)
                    continue
                for task_id in sorted(tasks):
                    tip = self.ledger(repo).tip(task_id)
                    if tip is not None and tip != self.tips.get((repo, task_id)):
                        await self.reconcile_task(repo, task_id)
            await self.schedule_pending()

    def _on_ref_change(self, repo: str, task_id: str | None = None) -> None:
        """Note a moved ref; a known task id avoids re-listing every task of the repo, and
        "" (a non-task ref) only needs announcing to replicas."""
        if task_id == "":
            self._announce.add(repo)
        elif task_id is None:
            self._dirty[repo] = None
        elif repo not in self._dirty:
            self._dirty[repo] = {task_id}
        elif self._dirty[repo] is not None:
            self._dirty[repo].add(task_id)  # type: ignore[union-attr]
        if self._kick is not None:
            self._kick.set()

    def run_finished(self, run: TaskRun) -> None:
        self.runs.pop(run.key, None)
        self.slots.release()
        self._on_ref_change(run.lease.repo, run.lease.task_id)

    # -- reconcile ---------------------------------------------------------------------
    async def reconcile_all(self) -> None:
        for repo in self.repos():
            self.watcher.watch(self.repo_path(repo))
        for repo in self.owned_repos():
            await self.reconcile_repo(repo, force=True)
        await self.schedule_pending()

    async def reconcile_repo(self, repo: str, force: bool = False) -> None:
        if not self.repo_path(repo).exists():
            return
        refs = self.ledger(repo).store.refs("refs/heads/task/")
        for ref, tip in sorted(refs.items()):
            task_id = task_id_of(ref)
            if task_id is None:
                continue
            key = (repo, task_id)
            if force or self.tips.get(key) != tip:
                await self.reconcile_task(repo, task_id)

    async def reconcile_task(self, repo: str, task_id: str) -> None:
        key = (repo, task_id)
        lock = self.locks.setdefault(key, asyncio.Lock())
        async with lock:
            ledger = self.ledger(repo)
            view = ledger.read(task_id)
            self.tips[key] = view.tip
            self.watch_lease(key, view)
            run = self.runs.get(key)
            if run is not None and (
                view.epoch != run.lease.epoch
                or view.node != self.node
                or view.state not in (taskcore.PLACED, taskcore.RUNNING)
            ):
                run.stand_down(f"task is now {view.state} {view.node}@{view.epoch}")
            if view.state == taskcore.SUBMITTED:
                opts = self.push_opts.pop((repo, task_id, view.tip), None)
                if opts is not None and opts.skip:
                    record_push(
                        ledger, [RefUpdate("", view.tip, f"refs/heads/task/{task_id}")], opts
                    )
                if is_skipped(ledger, task_id, view.tip):
                    return
                queue_submission(ledger, task_id, opts.priority if opts else None, self.cfg.limits)
                view = ledger.read(task_id)
                self.tips[key] = view.tip
            if view.state in (taskcore.QUEUED, taskcore.UNSCHEDULABLE):
                if self.pending.get(key, ("",))[0] != view.tip:
                    self.pending[key] = (view.tip, self._priority(key))
            elif (
                view.state in (taskcore.PLACED, taskcore.RUNNING)
                and view.node == self.node
                and key not in self.runs
            ):
                # Our lease, but nothing runs it here: we restarted. Fence the old lease
                # with a new epoch and place again; finished steps are kept.
                pidfile = self.layout.run / "steps" / f"{repo}__{task_id}.json"
                if kill_orphan(pidfile):
                    log.info("%s/%s: killed an orphaned step from before the restart", *key)
                tr = taskcore.requeue(view, f"agent {self.node} restarted; resuming")
                try:
                    tip = ledger.append(task_id, tr, expected_tip=view.tip, lease_epoch=tr.epoch)
                    self.tips[key] = tip
                    self.pending[key] = (tip, self._priority(key))
                except (CasConflict, StaleEpoch):
                    self._on_ref_change(repo)
            else:
                self.pending.pop(key, None)

    async def schedule_pending(self) -> None:
        """Place queued tasks, highest priority first; capacity waits keep them queued."""
        order = sorted((-prio, tip, key) for key, (tip, prio) in self.pending.items())
        for _, _, key in order:
            if self.slots.free == 0 and not self.remote_nodes():
                return  # nothing can start until a slot frees; that kicks us again
            await self._schedule(key)

    def _priority(self, key: Key) -> int:
        for _oid, tr, _subj in self.ledger(key[0]).history(key[1])[:20]:
            if tr is not None and "Priority" in tr.extra:
                try:
                    return int(tr.extra["Priority"])
                except ValueError:
                    return 50
        return 50

    async def _schedule(self, key: Key) -> None:
        repo, task_id = key
        asked = await self.server_placement.ask(key)  # a SERVER decides; no lock held
        lock = self.locks.setdefault(key, asyncio.Lock())
        async with lock:
            ledger = self.ledger(repo)
            view = ledger.read(task_id)
            if view.state not in (taskcore.QUEUED, taskcore.UNSCHEDULABLE):
                self.pending.pop(key, None)
                return
            if asked is not None and asked[0] != view.tip:
                return  # it moved while the server decided; that move kicks another pass
            try:
                spec = specmod.load_spec(
                    ledger.spec_bytes(task_id) or b"", specmod.SPEC_PATH, self.cfg.limits
                )
            except specmod.SpecError as e:
                self._unschedulable(ledger, view, f"invalid spec: {e}")
                self.pending.pop(key, None)
                return
            decision = asked[1] if asked else self.placer.place(repo, task_id, spec)
            if decision.waiting:
                return  # capacity will free up; stay queued without writing
            if decision.node is None:
                self._unschedulable(ledger, view, decision.reason)
                self.pending[key] = (
                    self.ledger(repo).tip(task_id) or view.tip,
                    self.pending[key][1],
                )
                return
            if decision.node != self.node:
                try:
                    lease = ledger.claim(task_id, decision.node, decision.extra)
                except (AlreadyClaimed, CasConflict, StaleEpoch):
                    return
                self.pending.pop(key, None)
                self.tips[key] = lease.tip
                self.watch_lease(key, ledger.read(task_id))
                if self.cluster is not None:
                    self.cluster.node.publish(
                        "assign",
                        f"{repo}/{task_id}",
                        {
                            "repo": repo,
                            "task": task_id,
                            "node": decision.node,
                            "epoch": lease.epoch,
                            "url": self.http_url(),
                            "owner": self.node,
                        },
                    )
                return
            if not self.slots.try_acquire():
                return
            try:
                lease = ledger.claim(task_id, self.node, decision.extra)
            except AlreadyClaimed as e:
                self.slots.release()
                log.info("%s/%s claimed by %s", repo, task_id, e)
                self.pending.pop(key, None)
                return
            except (CasConflict, StaleEpoch):
                self.slots.release()
                return
            self.pending.pop(key, None)
            self.tips[key] = lease.tip
            self.watch_lease(key, ledger.read(task_id))
            run = TaskRun(self, Lease(repo, task_id, self.node, lease.epoch))
            run.request = request_of(repo, task_id, spec)
            self.runs[key] = run
            asyncio.create_task(run.run())

    def _unschedulable(self, ledger: TaskLedger, view: taskcore.TaskView, reason: str) -> None:
        if view.state == taskcore.UNSCHEDULABLE and view.reason == " ".join(reason.split()):
            return
        tr = taskcore.mark_unschedulable(view, reason)
        try:
            ledger.append(view.task_id, tr, expected_tip=view.tip, lease_epoch=tr.epoch)
        except (CasConflict, StaleEpoch):
            pass

    # -- hooks -------------------------------------------------------------------------
    async def _on_hook(self, req: HookRequest) -> tuple[bool, list[str]]:
        updates = [RefUpdate.parse(r) for r in req.refs]
        options = PushOptions.parse(req.options)
        repo = Path(req.git_dir).name.removesuffix(".git")
        if req.phase == "pre-receive":
            verdict = check_pre_receive(
                req.git_dir,
                req.quarantine or None,
                updates,
                options,
                node=self.node,
                preview=lambda tid, spec: self.placer.preview(repo, tid, spec),
                owner_url=lambda: (
                    None
                    if self.replicas is None or self.replicas.is_owner(repo)
                    else self.owner_desc(repo)
                ),
                limits=self.cfg.limits,
            )
            if verdict.ok and self.replicas is not None and self.replicas.is_owner(repo):
                # last check: a commit the replicas acked but we then refused could be
                # promoted by a takeover, so nothing may refuse the push after this
                ok, why = await self.replicas.replicate_sync(
                    repo, [(u.old, u.new, u.ref) for u in updates], req.quarantine or None
                )
                if not ok:
                    verdict.reject(f"kovanex: {why}")
            if verdict.ok:
                for u in updates:
                    tid = task_id_of(u.ref)
                    if tid is not None and u.new != ZERO:
                        self.push_opts[(repo, tid, u.new)] = options
            return verdict.ok, verdict.messages
        if req.phase == "post-receive":
            # Answer at once (the pusher is waiting); queueing and placement follow on the
            # event loop. Push options were recorded at pre-receive.
            if repo not in self.repos():
                self.refresh_repos()
            self.watcher.watch(self.repo_path(repo))
            msgs = []
            for u in updates:
                tid = task_id_of(u.ref)
                if tid is None or u.new == ZERO:
                    continue
                self.push_opts.setdefault((repo, tid, u.new), options)
                self._on_ref_change(repo, tid)
                what = "skipped (push option skip)" if options.skip else "accepted"
                msgs.append(
                    f"kovanex: task {tid} {what} by {self.node}; "
                    f"follow it: kovanex task logs {tid} --follow"
                )
            return True, msgs
        return False, [f"kovanex: unknown hook phase {req.phase!r}"]

    # -- control -----------------------------------------------------------------------


def run_agent(layout: cfgmod.Layout, on_ready: Callable[[], None] | None = None) -> None:
    cfg = cfgmod.load(layout)
    import uvloop

    uvloop.run(Agent(layout, cfg).run(on_ready))
