"""Run one seed's scenario end to end and report the invariants it checked."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kovanex.core.replication import Ownership
from kovanex.gitstate.ledger import SPEC_PATH
from kovanex.gitstate.store import EMPTY_TREE
from kovanex.sim import checks
from kovanex.sim.agents import SimAgent
from kovanex.sim.lease import LeaseModel
from kovanex.sim.scenario import Push, Scenario, generate, spec_toml
from kovanex.sim.world import Acked, World

DEFAULT_OWNERSHIP = "decider"  # core/takeover.py, as the agent runs it (ADR 0019)
BUDGET = 400.0  # virtual seconds after the last fault for every task to finish
PUSH_TRIES = 6
PUSH_RETRY = 8.0
INVARIANTS = (
    "at most one runner per lease (task, epoch), checked as every run starts a step",
    "no acknowledged push lost, at any level, even when the acking owner was deposed: "
    "none only under refs/kovanex/lost/ (diverged branches are reconciled, ADR 0028)",
    "every task final (succeeded/failed/cancelled) on its owner after the heal",
    "exactly one owner per repo after the heal, and every live node agrees",
    "lease (core/leader.py over a modelled JetStream KV register): at most one holder per "
    "term, never two leaders at once, no write with an older term accepted, an "
    "absolute-consistency job never runs on two nodes at once nor past its node's halt "
    "deadline, and every acknowledged job done after the heal (ADR 0029)",
)


@dataclass
class Result:
    seed: int
    scenario: Scenario
    violations: list[str]
    gaps: list[str]
    tasks: int
    acked: int
    settled_at: float
    events: int
    log: list[str] = field(default_factory=list)
    ownership: str = ""
    reconciled: int = 0  # diverged branches merged after a heal (ADR 0028)
    lease: str = ""  # what the lease model saw (ADR 0029)

    @property
    def ok(self) -> bool:
        return not self.violations


class Driver:
    """Feeds a scenario's pushes and faults into a world."""

    def __init__(
        self,
        sc: Scenario,
        verbose: bool = False,
        ownership: str | None = None,
        reconcile: bool = True,
        lease: bool = True,
    ) -> None:
        self.sc = sc
        decider = (ownership or DEFAULT_OWNERSHIP) == "decider"
        w = self.w = World(sc.seed, len(sc.nodes), loss=sc.loss, verbose=verbose, decider=decider)
        w.reconcile = reconcile
        for i, name in enumerate(sc.nodes):
            w.agents[name] = SimAgent(w, name, sc.labels[name], sc.seed * 7919 + i)
        for r in sc.repos:
            own = Ownership(r.owner, 1, r.replicas, r.level, len(r.replicas))
            w.max_epoch[r.name] = 1
            for a in w.agents.values():
                a.disk.meta[r.name] = own
                if a.name == r.owner or a.name in r.replicas:
                    a.repos.store(r.name)
                    a.disk.synced[r.name] = (r.owner, 1)
        self.lease = LeaseModel(w, sc.seed) if lease else None
        self.open = 0
        self.outcomes: dict[tuple[str, str], list[str]] = {}  # (repo, task) -> each attempt
        for p in sc.pushes:
            self.open += 1
            w.at(p.at, self.push, p, 0)
        for f in sc.faults:
            if f.kind == "crash":
                w.at(f.at, self.crash, f.nodes[0])
                w.at(f.until, self.restart, f.nodes[0])
            else:
                rest = [x for x in sc.nodes if x not in f.nodes]
                w.at(f.at, w.partition, [list(f.nodes), rest])
                w.at(f.until, w.heal)

    def crash(self, name: str) -> None:
        if self.w.agents[name].up:
            self.w.agents[name].crash()
            if self.lease is not None:
                self.lease.crash(name)

    def restart(self, name: str) -> None:
        if not self.w.agents[name].up:
            self.w.agents[name].restart()
            if self.lease is not None:
                self.lease.restart(name)

    def push(self, p: Push, attempt: int) -> None:
        """A user pushes a new task branch to the owner its nearby node knows of."""
        w = self.w
        client = w.agents[p.client]
        if attempt >= PUSH_TRIES:
            self.open -= 1
            w.note(f"client@{p.client}: gave up pushing {p.repo}/{p.task_id}")
            return
        if not client.up:
            w.later(PUSH_RETRY, self.push, p, attempt + 1)
            return
        spec = spec_toml(p.steps, p.retries, dict(p.labels), p.strategy)
        tree = w.objects.tree_with(EMPTY_TREE, {SPEC_PATH: spec})
        msg = f"add task {p.task_id}\n"
        oid = w.objects.create_commit(tree, [], msg, ("user", "user@example.com"), 0)
        owner = client.repos.owner_of(p.repo) or p.client
        target = w.agents[owner]

        def reply(res: tuple[str, object]) -> None:
            kind, val = res
            self.outcomes.setdefault((p.repo, p.task_id), []).append(f"{kind}: {val}")
            if kind != "ok":
                w.note(f"client@{p.client}: push {p.repo}/{p.task_id} to {owner} refused: {val}")
                w.later(PUSH_RETRY, self.push, p, attempt + 1)
                return
            self.open -= 1
            epoch = int(val)  # type: ignore[call-overload]
            o = target.disk.meta[p.repo]
            sup = w.max_epoch.get(p.repo, 1) > epoch
            w.trace.acked.append(
                Acked(
                    p.repo,
                    p.task_id,
                    oid,
                    w.now,
                    owner,
                    epoch,
                    o.level,
                    w.partitioned,
                    sup,
                    o.replicas,
                )
            )
            w.note(f"client@{p.client}: push {p.repo}/{p.task_id} acked by {owner}@{epoch}")

        def fail(why: str) -> None:
            self.outcomes.setdefault((p.repo, p.task_id), []).append(f"failed: {why}")
            w.note(f"client@{p.client}: push {p.repo}/{p.task_id} to {owner} failed: {why}")
            w.later(PUSH_RETRY, self.push, p, attempt + 1)

        w.rpc(
            p.client,
            owner,
            lambda ok: target.repos.handle_push(p.repo, p.task_id, oid, ok),
            reply,
            fail,
            client=True,
        )

    # -- for short tests (kovanex.testing.sim_cluster) ----------------------------------
    def submit(
        self,
        client: str,
        repo: str,
        task_id: str,
        steps: int = 1,
        retries: int = 0,
        labels: dict[str, str] | None = None,
        strategy: str | None = None,
    ) -> None:
        """A user next to `client` pushes a new task now (retrying like the scenarios do)."""
        self.open += 1
        p = Push(
            self.w.now,
            client,
            repo,
            task_id,
            steps,
            retries,
            tuple(sorted((labels or {}).items())),
            strategy,
        )
        self.w.later(0.0, self.push, p, 0)

    def run(self, seconds: float) -> None:
        self.w.run_until(self.w.now + seconds)

    def owner(self, repo: str) -> str:
        (name,) = checks.owners(self.w)[repo]
        return name

    def history(self, repo: str, task_id: str) -> list[tuple[str, Any, str]]:
        """The task branch on the repo's owner, newest first: (oid, transition, subject)."""
        return self.w.agents[self.owner(repo)].repos.ledger(repo).history(task_id)

    def settled(self) -> bool:
        w = self.w
        if w.now < self.sc.quiet_at or self.open or w.partitioned:
            return False
        if not all(a.up for a in w.agents.values()):
            return False
        repos = [r.name for r in self.sc.repos]
        if self.lease is not None and self.lease.unfinished():
            return False
        return not checks.one_owner(w, repos) and not checks.unfinished(w, repos)[0]


def simulate(
    seed: int,
    strict: bool = False,
    verbose: bool = False,
    ownership: str | None = None,
    reconcile: bool = True,
    lease: bool = True,
) -> Result:
    """Run one seed. `ownership`: "decider" (the default: core/takeover.py, as the agent
    runs it) or "replication" (ADR 0007's rules applied through core/replication.py).
    `reconcile=False` replays the old heal (diverged tips kept only under lost/);
    `lease=False` leaves the coordination backend and the leader lease out (ADR 0029)."""
    sc = generate(seed)
    d = Driver(sc, verbose, ownership, reconcile, lease)
    w = d.w
    settled = w.run_until(sc.quiet_at + BUDGET, d.settled)
    repos = [r.name for r in sc.repos]
    bad = list(w.trace.violations)
    stuck, gaps = checks.unfinished(w, repos)
    if d.lease is not None:
        bad += d.lease.violations()
        stuck += d.lease.unfinished()
    if not settled:
        why = checks.one_owner(w, repos) + stuck
        if d.open:
            why.append(f"{d.open} pushes still retrying")
        bad += [f"not settled {BUDGET:g}s after the last fault: {x}" for x in why]
    lost, lost_gaps = checks.lost_acked(w, strict)
    bad += lost
    gaps += lost_gaps
    tasks = sum(
        len(w.agents[o[0]].repos.ledger(r).list_tasks()) for r, o in checks.owners(w).items() if o
    )
    return Result(
        seed,
        sc,
        bad,
        gaps + w.trace.known_gaps,
        tasks,
        len(w.trace.acked),
        w.now,
        w.loop.events,
        w.trace.log,
        "decider" if w.decider else "replication",
        len(w.reconciled),
        d.lease.summary() if d.lease is not None else "",
    )
