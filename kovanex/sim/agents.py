"""One simulated agent, built from the deciders the real agent uses.

Scheduling is `core.scheduler.Scheduler` (observe / order / decide), placement is
`core.scoring.place` over the node infos this node knows (the same waiting and
all-excluded rules as agent/placement.py), the placement deadline is
`core.startwatch`, failed lease holders are found by `failed_holders` and requeued by
`requeue_held_by`. Effects are executed the way the module docstring of
core/scheduler.py says: in order, stopping at the first refused write. Membership is
the real gossip core; assignments and ownership travel as gossip app data, as in the
agent. Not modelled: other nodes' load comes from the simulated nodes themselves (it
stands for the health gossip), runners never refuse for lack of a slot, and start
failures are never reported (only the deadline requeues).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from kovanex import spec as specmod
from kovanex.core import placing, startwatch
from kovanex.core import task as taskcore
from kovanex.core.effects import (
    Assign,
    KillOrphan,
    Publish,
    QueueSubmission,
    StandDown,
    StartRun,
    WriteRef,
)
from kovanex.core.membership import MEMBER_FAILED, MEMBER_JOIN, MEMBER_LEAVE
from kovanex.core.scheduler import (
    Decision,
    Scheduler,
    failed_holders,
    priority_of,
    requeue_held_by,
)
from kovanex.core.scoring import NodeInfo
from kovanex.gitstate.ledger import transition_of
from kovanex.gitstate.store import CasConflict, StaleEpoch
from kovanex.sim.ownership import DecidedRepos
from kovanex.sim.repos import Disk, Repos, own_of
from kovanex.sim.runner import SimRun
from kovanex.sim.world import World

SLOTS = 2
PASS_EVERY = 1.0
FETCH_EVERY = 10.0
JOIN_EVERY = 10.0
DEADLINE = 10.0  # the lan profile's placement deadline
Key = tuple[str, str]


class SimAgent:
    def __init__(self, world: World, name: str, labels: dict[str, str], seed: int) -> None:
        self.w = world
        self.name = name
        self.labels = labels
        self.rng = random.Random(seed)
        self.up = True
        self.gen = 0
        self.disk = Disk()
        self._boot()

    # ------------------------------------------------------------ lifecycle
    def _boot(self) -> None:
        """Everything in memory starts empty; the disk is kept."""
        self.repos = (DecidedRepos if self.w.decider else Repos)(self, self.disk)
        self.sched = Scheduler(self.name)
        self.runs: dict[Key, SimRun] = {}
        self.seen: dict[Key, int] = {}  # newest lease epoch we were assigned per task
        self.watches: dict[Key, startwatch.Watch] = {}
        self.kicked: set[str] = set()
        self.rr = 0
        self.after(self.rng.uniform(0, PASS_EVERY), self._every, PASS_EVERY, self.pass_all)
        self.after(self.rng.uniform(0, FETCH_EVERY), self._every, FETCH_EVERY, self.anti_entropy)
        self.after(self.rng.uniform(0, JOIN_EVERY), self._every, JOIN_EVERY, self.retry_join)

    def crash(self) -> None:
        for run in list(self.runs.values()):
            run.stop("node crashed", quiet=True)
        self.up = False
        self.gen += 1
        self.w.cluster.crash(self.name)
        self.w.note(f"{self.name}: crash")

    def restart(self) -> None:
        self.up = True
        self.gen += 1
        self._boot()
        seeds = [
            n for n in sorted(self.w.agents) if n != self.name and self.w.can_talk(self.name, n)
        ]
        self.w.cluster.restart(self.name, join=seeds[:3] or None)
        self.w.note(f"{self.name}: restart")

    def retry_join(self) -> None:
        """Consul's retry_join: push-pull with a configured peer we do not see alive at its
        current address (a restarted node comes back at a new one)."""
        nd = self.w.cluster.nodes[self.name]
        for n in sorted(self.w.agents):
            other = self.w.cluster.nodes[n]
            m = nd.core.members.get(n)
            if n == self.name or not other.up:
                continue
            if m is None or m.addr != other.addr or m.status not in ("alive", "suspect"):
                self.w.cluster._run(nd, nd.core.join(self.w.now, [other.addr]))
                return

    def after(self, dt: float, fn: Callable[..., None], *args: Any) -> None:
        """A timer that dies with this incarnation of the node."""
        self.w.later(dt, self._fire, self.gen, fn, args)

    def _fire(self, gen: int, fn: Callable[..., None], args: tuple[Any, ...]) -> None:
        if self.up and self.gen == gen:
            fn(*args)

    def _every(self, period: float, fn: Callable[[], None]) -> None:
        fn()
        self.after(period, self._every, period, fn)

    # ------------------------------------------------------------ gossip events
    def on_publish(self, e: Publish) -> None:
        if e.topic in (MEMBER_FAILED, MEMBER_LEAVE):
            self.on_member_failed(e.payload.name)
        elif e.topic == MEMBER_JOIN:
            self.repos.on_member_joined(e.payload.name)
            for repo in self.repos.owned():
                self.kick(repo)
        elif e.topic == "owner":
            self.repos.on_owner(e.payload.key, own_of(e.payload.value))
        elif e.topic == "assign":
            self.on_assign(e.payload.value)

    def on_member_failed(self, name: str) -> None:
        self.repos.on_member_failed(name)
        for repo in self.repos.owned():
            led = self.repos.ledger(repo)
            for tid in led.list_tasks():
                self.execute(repo, requeue_held_by(repo, led.read(tid), name))
            self.kick(repo)

    def on_assign(self, v: dict[str, Any]) -> None:
        if v["node"] != self.name:
            return
        key = (v["repo"], v["task"])
        if self.seen.get(key, 0) >= v["epoch"]:
            return
        self.seen[key] = v["epoch"]
        self.start_run(v["repo"], v["task"], v["epoch"], (v["owner"], v["oe"]))

    # ------------------------------------------------------------ runs
    def start_run(self, repo: str, task_id: str, epoch: int, issuer: tuple[str, int]) -> None:
        key = (repo, task_id)
        old = self.runs.get(key)
        if old is not None:
            if old.epoch >= epoch:
                return
            old.stop("superseded by a newer lease")
        self.seen[key] = max(self.seen.get(key, 0), epoch)
        run = SimRun(self, repo, task_id, epoch, issuer)
        self.runs[key] = run
        run.start()

    def run_ended(self, run: SimRun) -> None:
        if self.runs.get(run.key) is run:
            del self.runs[run.key]
        for repo in self.repos.owned():
            self.kick(repo)

    # ------------------------------------------------------------ the scheduling pass
    def kick(self, repo: str) -> None:
        if repo not in self.kicked:
            self.kicked.add(repo)
            self.after(0.02, self._kicked, repo)

    def _kicked(self, repo: str) -> None:
        self.kicked.discard(repo)
        self.pass_repo(repo)

    def pass_all(self) -> None:
        self.repos.tick()
        for repo in self.repos.owned():
            self.pass_repo(repo)

    def anti_entropy(self) -> None:
        for repo in sorted(self.disk.stores):
            self.repos.fetch(repo)

    def pass_repo(self, repo: str) -> None:
        if not self.repos.owns(repo):
            return
        led = self.repos.ledger(repo)
        for tid in led.list_tasks():
            run = self.runs.get((repo, tid))
            fx = self.sched.observe(
                repo,
                led.read(tid),
                run_epoch=run.epoch if run is not None else None,
                priority=lambda tid=tid: self._priority(repo, tid),
            )
            self.execute(repo, fx)
        views = [led.read(tid) for tid in led.list_tasks()]
        for dead in failed_holders(views, self.w.status_view(self.name), self.name):
            for v in views:
                self.execute(repo, requeue_held_by(repo, v, dead))
        now = self.w.now
        for tid in led.list_tasks():
            key = (repo, tid)
            v = led.read(tid)
            w = startwatch.watch(v, self.watches.get(key), now)
            if w is None:
                self.watches.pop(key, None)
                continue
            self.watches[key] = w
            tr = startwatch.decide(v, w, now, DEADLINE, None, self._excluded(repo, tid))
            if tr is not None:
                self.execute(repo, [WriteRef(repo, tid, tr, v.tip)])
        for key in self.sched.order():
            if key[0] != repo:
                continue
            if led.tip(key[1]) is None:
                self.sched.pending.pop(key, None)  # the branch went to lost/ on demotion
                continue
            v = led.read(key[1])
            decision = self.place(repo, key[1])
            free = sum(1 for r in self.runs.values() if r.active) < SLOTS
            self.execute(repo, self.sched.decide(repo, v, decision, slot_free=free))

    def _priority(self, repo: str, tid: str) -> int:
        led = self.repos.ledger(repo)
        tip = led.tip(tid)
        if tip is None:
            return 50
        return priority_of(transition_of(c.message) for c in led.store.walk(tip))

    def _excluded(self, repo: str, tid: str) -> frozenset[str]:
        led = self.repos.ledger(repo)
        tip = led.tip(tid)
        if tip is None:
            return frozenset()
        return startwatch.excluded(transition_of(c.message) for c in led.store.walk(tip))

    def execute(self, repo: str, effects: list[Any]) -> None:
        """In order; the first refused write ends the batch (the next pass re-reads)."""
        led = self.repos.ledger(repo)
        moved = False
        for e in effects:
            if isinstance(e, WriteRef | QueueSubmission):
                try:
                    if isinstance(e, QueueSubmission):
                        v = led.read(e.task_id)
                        spec = specmod.load_spec(led.spec_bytes(e.task_id) or b"")
                        tr, tip = taskcore.queue(v, spec.priority), v.tip
                        led.append(e.task_id, tr, expected_tip=tip, lease_epoch=tr.epoch)
                    else:
                        trs, tip = [e.transition, *e.then], e.expected_tip
                        led.append_all(e.task_id, trs, expected_tip=tip, lease_epoch=trs[0].epoch)
                except (CasConflict, StaleEpoch, taskcore.IllegalTransition):
                    self.kick(repo)
                    break
                moved = True
            elif isinstance(e, StartRun):
                o = self.disk.meta[repo]
                self.start_run(repo, e.task_id, e.epoch, (o.owner, o.epoch))
            elif isinstance(e, Assign):
                value = {
                    "repo": repo,
                    "task": e.task_id,
                    "node": e.node,
                    "epoch": e.epoch,
                    "owner": self.name,
                    "oe": self.disk.meta[repo].epoch,
                }
                self.w.publish(self.name, "assign", f"{repo}/{e.task_id}", value)
            elif isinstance(e, StandDown):
                run = self.runs.get((repo, e.task_id))
                if run is not None:
                    run.stop(e.reason)
            elif isinstance(e, KillOrphan):
                pass  # no step outlives its agent in the simulator
        if moved:
            self.repos.changed(repo)

    # ------------------------------------------------------------ placement
    def node_infos(self) -> list[NodeInfo]:
        out = []
        for n, s in sorted(self.w.status_view(self.name).items()):
            if s != "alive":
                continue
            other = self.w.agents[n]
            runs = [r for r in other.runs.values() if r.active] if other.up else []
            meta = self.disk.meta
            out.append(
                NodeInfo(
                    name=n,
                    labels=dict(other.labels),
                    cpu_total=4.0,
                    cpu_used=0.1 * len(runs),
                    mem_total_mb=4096.0,
                    mem_used_mb=64.0 * len(runs),
                    runners_total=SLOTS,
                    runners_used=min(len(runs), SLOTS),
                    repos_owned=frozenset(r for r, o in meta.items() if o.owner == n),
                    repos_replica=frozenset(r for r, o in meta.items() if n in o.replicas),
                )
            )
        return out

    def place(self, repo: str, tid: str) -> Decision:
        """The agent's placement rules (core/placing.py) over the nodes this one sees."""
        led = self.repos.ledger(repo)
        spec = specmod.load_spec(led.spec_bytes(tid) or b"")
        strategy = spec.placement.strategy or "best-fit"
        d = placing.decide(
            self.node_infos(), spec.request(repo, tid), strategy, self._excluded(repo, tid), self.rr
        )
        if d.node is not None:
            self.rr += 1
        return d
