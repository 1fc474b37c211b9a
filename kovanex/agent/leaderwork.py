"""The leader's single-decider work, and carrying it out where it lands (issue 12 part 2,
ADR 0036). Coordination `nats` only: on the gossip backend nothing here runs.

Three roles, every node plays the ones that apply:
- owner: publishes gossip topic "consistent" (key repo) while the repo holds
  absolute-consistency tasks: {owner, tasks: {task: [holder, epoch]}}. Its presence tells
  every replica that the leader, not the gossip takeover rule, moves this repo.
- leader: each pass feeds its view to the pure decider (core/grants.py) and publishes the
  effects: "grant" (key repo) and "resched" (key repo/task), each with its term.
- grantee / owner: carries a grant or a reschedule out by CAS (the ownership record with
  `Kovanex-Term`, or a requeue transition with `Kovanex-Term`), after refusing a term older
  than the one it knows; the stores refuse one older than their history's as well.

Gossip is only the carrier: a decision counts once a CAS wrote it, and a stale one (an old
epoch, an old term) is refused where it lands. No lock is held across network I/O.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from kovanex.clock import settled
from kovanex.core import grantmemory
from kovanex.core import grants as core
from kovanex.core import task as taskcore
from kovanex.core.decider import Driver
from kovanex.core.replication import Ownership
from kovanex.gitstate.store import CasConflict, StaleEpoch

if TYPE_CHECKING:
    from kovanex.agent.services import NodeServices
    from kovanex.net.gossip import GossipNode

log = logging.getLogger("kovanex.leader")
TOPIC = "consistent"
HELD = frozenset({taskcore.PLACED, taskcore.RUNNING})


class LeaderWork:
    def __init__(
        self,
        agent: NodeServices,
        requeued: Callable[[str, str], None] = lambda repo, task: None,
    ) -> None:
        self.a = agent
        self.on = agent.coord.backend == "nats"
        self.ttl_s = agent.ctx.cfg.coordination.lease_ttl_s
        self.period = agent.ctx.cfg.coordination.renew_interval_s
        # what this leader issued, and since when members are gone (core/grantmemory.py)
        self.memory = Driver(grantmemory.decide, grantmemory.memory(self.ttl_s))
        self._kinds: dict[tuple[str, str], bool] = {}  # task -> absolute_consistency?
        self.requeued = requeued  # a reschedule was written: the scheduler takes it in

    @property
    def gossip(self) -> GossipNode:
        return self.a.cluster.node

    def term(self) -> int:
        return int(self.a.coord.summary()["term"])

    # -- who decides what ------------------------------------------------------------------
    def task_is_consistent(self, repo: str, task_id: str) -> bool:
        key = (repo, task_id)
        if key not in self._kinds:
            spec = self.a.consistent.spec_of(repo, task_id)
            if spec is None:
                return False  # unreadable now: decide again next time
            self._kinds[key] = self.a.consistent.consistent(spec)
        return self._kinds[key]

    def decides_task(self, repo: str, task_id: str) -> bool:
        """Failover leaves this task's requeue to the leader."""
        return self.on and self.task_is_consistent(repo, task_id)

    def decides_repo(self, repo: str) -> bool:
        """No replica takes this repo over by the gossip rule: the leader grants it."""
        return self.on and self.gossip.get(TOPIC, repo) is not None

    # -- the loop ------------------------------------------------------------------------
    def start(self) -> list[asyncio.Task[Any]]:
        if not self.on:
            return []
        self.gossip.subscribe("grant", self._on_grant)
        self.gossip.subscribe("resched", self._on_resched)
        return [asyncio.create_task(self.run())]

    async def run(self) -> None:
        while True:
            await self.a.ctx.clock.sleep(self.period)
            try:
                self.publish_owned()
                now = self.a.ctx.clock.monotonic()
                self._track_members(now)
                if self.a.coord.leads():
                    self.decide(now)
            except Exception:  # noqa: BLE001 - one bad pass must not end the loop
                log.exception("leader work pass failed")

    # -- after a heal: know the owners before placing consistent work (core/rejoin.py) -----
    async def resync(self) -> tuple[int, int]:
        """Push-pull with every member we know of (dead ones too: after a heal gossip may
        not have seen them alive yet), then let the owner announcements it brought be
        applied (a demotion runs as its own task). Returns (peers answered, members known)."""
        members = [m for m in self.gossip.members() if m.status != "left"]
        peers = [m.addr for m in members if m.name != self.a.ctx.name]
        rt = self.a.replicas.rt
        before = set(rt.tasks)
        answered = await self.gossip.sync(peers, timeout=2.0) if peers else set()
        started = set(rt.tasks) - before
        if started:
            await settled(self.a.ctx.clock, started, 2.0)
        known = len({m.name for m in members} | {self.a.ctx.name})
        return len(answered), known

    # -- owner: what the leader must know -------------------------------------------------
    def publish_owned(self) -> None:
        owned = set(self.a.repos.owned())
        tasks: dict[str, dict[str, list[Any]]] = {r: {} for r in owned}
        active = set(self.a.scheduler.active)
        self._kinds = {k: v for k, v in self._kinds.items() if k in active}  # memory: live only
        for repo, task_id in sorted(active):
            if repo not in owned or not self.task_is_consistent(repo, task_id):
                continue
            try:
                v = self.a.repos.ledger(repo).read(task_id)
            except Exception:  # noqa: BLE001 - archived or gone meanwhile
                continue
            holder = v.node if v.state in HELD else ""
            tasks[repo][task_id] = [holder, v.epoch]
        for repo, held in sorted(tasks.items()):
            value = {"owner": self.a.ctx.name, "tasks": held} if held else None
            cur = self.gossip.get(TOPIC, repo)
            if cur != value and (value is not None or cur is not None):
                self.gossip.publish(TOPIC, repo, value)

    # -- leader ----------------------------------------------------------------------------
    def _track_members(self, now: float) -> None:
        statuses = {m.name: m.status for m in self.gossip.members()}
        self.memory.step(grantmemory.MembersSeen(statuses), now)

    def view(self, now: float) -> core.LeaderView:
        """The leader's view but its memory (core/grantmemory.py fills that in)."""
        consistent, held = set(), []
        for repo, v in self.gossip.items(TOPIC).items():
            if not isinstance(v, dict) or not isinstance(v.get("tasks"), dict):
                continue
            consistent.add(repo)
            for task_id, row in sorted(v["tasks"].items()):
                if isinstance(row, list) and len(row) == 2 and row[0]:
                    held.append(core.Held(repo, task_id, str(row[0]), int(row[1])))
        return core.LeaderView(
            nodes=self.a.replicas.peers.state(self.a.replicas.ownership.settle_s),
            leads=self.a.coord.leads(),
            term=self.term(),
            ttl_s=self.ttl_s,
            consistent=frozenset(consistent),
            held=tuple(held),
        )

    def decide(self, now: float) -> None:
        for e in self.memory.step(grantmemory.Pass(self.view(now)), now):
            if isinstance(e, core.Grant):
                log.warning("leader grants %s to %s at term %d", e.repo, e.new.owner, e.term)
                self.gossip.publish("grant", e.repo, grant_value(e))
                self.a.cluster.record("ownership", {"repo": e.repo, "msg":
                    f"leader grants it to {e.new.owner} at term {e.term}"})  # fmt: skip
            else:
                log.warning("leader re-places %s/%s (held by %s) at term %d",
                            e.repo, e.task_id, e.node, e.term)  # fmt: skip
                self.gossip.publish("resched", f"{e.repo}/{e.task_id}", {
                    "owner": e.owner, "node": e.node, "epoch": e.epoch, "term": e.term})  # fmt: skip

    # -- grantee ---------------------------------------------------------------------------
    def _on_grant(self, topic: str, payload: Any) -> None:
        g = parse_grant(payload.key, payload.value)
        if g is not None and g.new.owner == self.a.ctx.name:
            asyncio.get_running_loop().create_task(self.take(g))

    async def take(self, g: core.Grant) -> bool:
        why = core.admit(self.term(), g.term)
        if why is not None:
            log.warning("%s: grant refused: %s", g.repo, why)
            return False
        return await self.a.replicas.ownership.granted(g.repo, g.old, g.new, g.term)

    # -- owner -----------------------------------------------------------------------------
    def _on_resched(self, topic: str, payload: Any) -> None:
        v = payload.value
        repo, _, task_id = str(payload.key).partition("/")
        if not isinstance(v, dict) or v.get("owner") != self.a.ctx.name:
            return
        try:
            node, epoch, term = str(v["node"]), int(v["epoch"]), int(v["term"])
        except (KeyError, TypeError, ValueError):
            return
        asyncio.get_running_loop().create_task(self.requeue(repo, task_id, node, epoch, term))

    async def requeue(self, repo: str, task_id: str, node: str, epoch: int, term: int) -> bool:
        """The leader's reschedule: requeue under a new epoch with its term (the ledger
        refuses an older term than the branch has seen); placement then re-grants it."""
        why = core.admit(self.term(), term)
        if why is not None or repo not in self.a.repos.owned():
            if why:
                log.warning("%s/%s: reschedule refused: %s", repo, task_id, why)
            return False
        async with self.a.locks.of((repo, task_id)):
            ledger = self.a.repos.ledger(repo)
            view = ledger.read(task_id)
            if view.state not in HELD or (view.node, view.epoch) != (node, epoch):
                return False  # it moved since the leader looked
            reason = f"node {node} is gone; the leader re-places it at term {term}"
            tr = taskcore.requeue(view, reason)
            tr = replace(tr, extra={**tr.extra, "Term": str(term)})
            try:
                ledger.append(task_id, tr, expected_tip=view.tip, lease_epoch=tr.epoch)
            except (CasConflict, StaleEpoch) as e:  # StaleTerm is a StaleEpoch
                log.warning("%s/%s: reschedule refused: %s", repo, task_id, e)
                return False
        log.info("%s/%s requeued by the leader at term %d", repo, task_id, term)
        self.requeued(repo, task_id)
        return True


def grant_value(g: core.Grant) -> dict[str, Any]:
    return {
        "owner": g.new.owner,
        "epoch": g.new.epoch,
        "replicas": list(g.new.replicas),
        "level": g.new.level,
        "wanted": g.new.replicas_wanted,
        "old_owner": g.old.owner,
        "old_epoch": g.old.epoch,
        "term": g.term,
    }


def parse_grant(repo: str, v: Any) -> core.Grant | None:
    if not isinstance(v, dict):
        return None
    try:
        new = Ownership(str(v["owner"]), int(v["epoch"]),
                        tuple(str(r) for r in v.get("replicas", [])),
                        str(v.get("level", "async")), int(v.get("wanted", 0)))  # fmt: skip
        old = replace(new, owner=str(v["old_owner"]), epoch=int(v["old_epoch"]))
        return core.Grant(repo, old, new, int(v["term"]))
    except (KeyError, TypeError, ValueError):
        return None
