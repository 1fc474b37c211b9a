"""absolute_consistency work and the quorum (issue 12 part 4): tell the lease decider what
runs here, halt it when the decider says so, and keep placement waiting without a quorum.

Why a requeue and not a new task state: a `queued` transition with reason "halted: ..."
at epoch + 1 is the commit that records the halt; the epoch fences the killed run, and the
next placement (only with a quorum again) resumes from the last step commit under a new
epoch, exactly as a failover requeue does (ADR 0008).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from kovanex import spec as specmod
from kovanex.agent.context import NodeContext
from kovanex.agent.coordination.backend import Coordination
from kovanex.agent.repos import RepoIndex
from kovanex.agent.runs import RunTable
from kovanex.agent.scheduling import TaskLocks
from kovanex.core import task as taskcore
from kovanex.gitstate.store import CasConflict, StaleEpoch

log = logging.getLogger("kovanex.agent")
CONSISTENT = "absolute_consistency"
HELD = frozenset({taskcore.PLACED, taskcore.RUNNING})


class ConsistentWork:
    def __init__(
        self,
        ctx: NodeContext,
        coord: Coordination,
        repos: RepoIndex,
        runs: RunTable,
        locks: TaskLocks,
        *,
        kick: Callable[[], None] = lambda: None,
        hand_back: Callable[[str, str, int, str], Awaitable[bool]] | None = None,
    ) -> None:
        self.ctx = ctx
        self.coord = coord
        self.repos = repos
        self.runs = runs
        self.locks = locks
        self.kick = kick  # a placement pass
        # RemoteRuns.hand_back(repo, task, epoch, why)
        self.hand_back = hand_back if hand_back is not None else _no_hand_back
        self.halted_owned: dict[tuple[str, str], int] = {}  # halted as owner -> its epoch

    def consistent(self, spec: specmod.TaskSpec) -> bool:
        return (spec.failover or self.ctx.cfg.coordination.failover_default) == CONSISTENT

    def grant(self, spec: specmod.TaskSpec, repo: str) -> dict[str, str] | None:
        """The scheduler's gate: nothing consistent is placed without a quorum (and, after
        a heal, a state sync: core/rejoin.py), nor in a repo this node no longer owns (a
        demotion the sync brought), and its placement carries the leader term
        (`Kovanex-Term`) the hooks and store fence on."""
        if not self.consistent(spec):
            return {}
        if not self.coord.can_place() or repo not in self.repos.owned():
            return None
        return {"Term": str(self.coord.summary()["term"])}

    def spec_of(self, repo: str, task_id: str) -> specmod.TaskSpec | None:
        try:
            data = self.repos.ledger(repo).spec_bytes(task_id) or b""
            return specmod.load_spec(data, specmod.SPEC_PATH, self.ctx.cfg.limits)
        except (specmod.SpecError, OSError, KeyError):
            return None

    def running(self) -> frozenset[tuple[str, str]]:
        out = set()
        for repo, task_id in list(self.runs.runs):
            spec = self.spec_of(repo, task_id)
            if spec is not None and self.consistent(spec):
                out.add((repo, task_id))
        return frozenset(out)

    async def watch(self) -> None:
        """Keep the decider's view of what consistent work runs here current."""
        period = self.ctx.cfg.coordination.renew_interval_s / 2
        while self.coord.backend == "nats":
            self.coord.set_consistent(self.running())
            await self.ctx.clock.sleep(period)

    def halt(self, repo: str, task_id: str, why: str) -> None:
        asyncio.get_running_loop().create_task(self._halt(repo, task_id, why))

    async def _halt(self, repo: str, task_id: str, why: str) -> None:
        key = (repo, task_id)
        self.runs.stand_down(key, f"halted: {why}")  # kill first: no quorum, no work
        if repo not in self.repos.owned():
            return  # the owner records it: its own halt, or the leader's reschedule (ADR 0036)
        async with self.locks.of(key):
            ledger = self.repos.ledger(repo)
            view = ledger.read(task_id)
            if view.state not in HELD:
                return
            self.halted_owned[key] = view.epoch
            tr = taskcore.requeue(view, f"halted: {why}")
            try:
                ledger.append(task_id, tr, expected_tip=view.tip, lease_epoch=tr.epoch)
            except (CasConflict, StaleEpoch):
                return
        log.warning("%s/%s halted: %s", repo, task_id, why)

    def synced(self) -> None:
        """After the heal's state sync: a task we halted as its owner, in a repo taken over
        meanwhile, still reads as held by us on the new owner; hand it back there."""
        owned = set(self.repos.owned())
        for (repo, task_id), epoch in sorted(self.halted_owned.items()):
            del self.halted_owned[(repo, task_id)]
            if repo not in owned:
                why = f"halted on {self.ctx.name} while it was cut off; its repo moved"
                asyncio.get_running_loop().create_task(self.hand_back(repo, task_id, epoch, why))
        self.kick()

    def resume(self, repo: str, task_id: str, term: int) -> None:
        log.info("%s/%s may resume (quorum back, term %d)", repo, task_id, term)
        self.kick()


async def _no_hand_back(repo: str, task_id: str, epoch: int, why: str) -> bool:
    return False
