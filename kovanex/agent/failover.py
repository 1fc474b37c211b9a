"""Leases held by failed nodes go back to the queue (ADR 0008).

Membership tells us a node failed (SWIM's dead, a graceful leave, or a refused TCP
connect to a suspect's HTTP port); the rule of what to requeue is the scheduler core's
(`requeue_held_by`, `failed_holders`), and epochs fence the old holder either way."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from typing import Any

from kovanex.agent.context import NodeContext
from kovanex.agent.repos import RepoIndex
from kovanex.agent.scheduling import TaskLocks
from kovanex.core import scheduler, startwatch, suspectprobe
from kovanex.core import task as taskcore
from kovanex.core.decider import Driver
from kovanex.core.effects import WriteRef
from kovanex.gitstate.ledger import NoSuchTask, exclusions
from kovanex.gitstate.store import CasConflict, StaleEpoch
from kovanex.net.gossip import GossipNode, MemberInfo

log = logging.getLogger("kovanex.agent")
PROBE_S = 0.2


class Failover:
    def __init__(
        self,
        ctx: NodeContext,
        repos: RepoIndex,
        locks: TaskLocks,
        gossip: GossipNode,
        *,
        requeued: Callable[[str, str], None] = lambda repo, task: None,
        changed: Callable[[], None] = lambda: None,
        record: Callable[[str, dict[str, Any]], None] = lambda kind, data: None,
        tracked: Callable[[], Iterable[tuple[str, str]]] | None = None,
        leader_decides: Callable[[str, str], bool] = lambda repo, task: False,
    ) -> None:
        self.ctx = ctx
        self.repos = repos
        self.locks = locks
        self.gossip = gossip
        self.requeued = requeued  # a requeue was written
        self.changed = changed  # capacity or holders changed: a placement pass
        self.record = record
        # the tasks that can hold a lease (the scheduler's active set); None: every task
        self.tracked = tracked
        # with coordination on, the leader re-places absolute-consistency tasks (ADR 0036)
        self.leader_decides = leader_decides
        self._peers = asyncio.Event()  # set on any member event (probe_suspects wakes)

    def on_member_event(self, topic: str, member: MemberInfo) -> None:
        """Membership changed: capacity may have appeared, or a lease holder died."""
        self._peers.set()  # someone else is (or was) there: suspects are possible again
        if topic in ("member-failed", "member-leave"):
            asyncio.get_running_loop().create_task(self.requeue_held_by(member.name))
        elif topic == "member-join":
            asyncio.get_running_loop().create_task(self.let_back(member.name))
        self.changed()

    async def let_back(self, node: str) -> None:
        """`node` joined again (restarted, or back from dead): the unschedulable tasks that
        excluded it are queued again with it let back in (core: startwatch.rejoined)."""
        owned = self.repos.owned()
        keys = (
            [(r, t) for r in owned for t in self.repos.ledger(r).list_tasks()]
            if self.tracked is None
            else sorted(k for k in self.tracked() if k[0] in owned)
        )
        for repo, task_id in keys:
            ledger = self.repos.ledger(repo)
            async with self.locks.of((repo, task_id)):
                try:
                    view = ledger.read(task_id)
                except NoSuchTask:  # archived or moved meanwhile
                    continue
                if view.state != taskcore.UNSCHEDULABLE:
                    continue
                tr = startwatch.rejoined(view, exclusions(ledger, task_id), node)
                if tr is None:
                    continue
                try:
                    ledger.append(task_id, tr, expected_tip=view.tip, lease_epoch=tr.epoch)
                except (CasConflict, StaleEpoch):
                    continue
                log.info("%s/%s queued again: %s", repo, task_id, tr.reason)
                self.requeued(repo, task_id)
        self.changed()

    def status(self) -> dict[str, str]:
        return {m.name: m.status for m in self.gossip.members()}

    async def requeue_held_by(self, failed: str) -> None:
        """Every task a failed node held is queued again under a new epoch; the next
        holder resumes after the last step commit, and the old holder is fenced out."""
        for repo in self.repos.owned():
            ledger = self.repos.ledger(repo)
            for task_id in ledger.list_tasks():
                if self.leader_decides(repo, task_id):
                    continue
                async with self.locks.of((repo, task_id)):
                    view = ledger.read(task_id)
                    for e in scheduler.requeue_held_by(repo, view, failed):
                        assert isinstance(e, WriteRef)
                        try:
                            ledger.append(
                                task_id,
                                e.transition,
                                expected_tip=e.expected_tip,
                                lease_epoch=e.transition.epoch,
                            )
                        except (CasConflict, StaleEpoch):
                            continue
                        log.info("%s/%s requeued: holder %s failed", repo, task_id, failed)
                        self.requeued(repo, task_id)
        self.changed()

    async def fence_failed_holders(self) -> None:
        """Backstop for a missed member-failed event: requeue leases of dead/left nodes."""
        status = self.status()
        owned = self.repos.owned()
        keys = (
            [(r, t) for r in owned for t in self.repos.ledger(r).list_tasks()]
            if self.tracked is None
            else sorted(k for k in self.tracked() if k[0] in owned)
        )
        views = (
            self.repos.ledger(r).read(t) for r, t in keys if self.repos.ledger(r).tip(t) is not None
        )
        for name in scheduler.failed_holders(views, status, self.ctx.name):
            await self.requeue_held_by(name)

    def _has_peers(self) -> bool:
        """Another member that is alive or suspect: only those can need a probe."""
        return any(
            m.name != self.ctx.name and m.status in ("alive", "suspect")
            for m in self.gossip.members()
        )

    async def probe_suspects(self) -> None:
        """Confirm a suspect lease holder's crash early (core/suspectprobe.py decides): a
        refused TCP connect to its HTTP port means no agent is listening there."""
        probes = Driver(suspectprobe.decide, suspectprobe.ProbeState(self.ctx.name))
        while True:
            if not self._has_peers():
                # alone, nobody can be suspect: sleep until a member event, not 5 times a
                # second (an empty node's idle CPU, issue 22 part 7)
                self._peers.clear()
                if not self._has_peers():
                    await self._peers.wait()
            await self.ctx.clock.sleep(PROBE_S)
            members = tuple(
                suspectprobe.Member(m.name, m.status, m.incarnation, (m.meta or {}).get("http", ""))
                for m in self.gossip.members()
            )
            for p in probes.step(suspectprobe.Suspects(members), self.ctx.clock.monotonic()):
                assert isinstance(p, suspectprobe.Probe)
                outcome = await self._connect(p.host, p.port)
                ev = suspectprobe.Probed(p.name, p.incarnation, p.http, outcome)
                for c in probes.step(ev, self.ctx.clock.monotonic()):
                    assert isinstance(c, suspectprobe.Confirmed)
                    log.info(
                        "suspect %s refuses connections on %s: its agent is gone", c.name, c.http
                    )
                    self.record("lease-guard", {"member": c.name, "msg": "connection refused"})
                    await self.requeue_held_by(c.name)

    async def _connect(self, host: str, port: int) -> str:
        """One TCP connect with a deadline: refused, answered, or unknown."""
        try:
            _r, w = await self.ctx.clock.wait_for(asyncio.open_connection(host, port), 0.3)
        except ConnectionRefusedError:
            return "refused"
        except (OSError, TimeoutError, ValueError):
            return "unknown"
        w.close()
        return "answered"
