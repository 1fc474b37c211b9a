"""Runs of other owners' tasks (ADR 0008): an owner assigns us a lease over gossip; we
read and write its branch over HTTP through a cache repo, and watch for a cancel.

The decisions (start, redeliver after a crash, stand down, hand back) are the pure
core/remoterun.py's; this shell gathers its events (gossip, the owner's branch, runs that
end) and carries out its effects.

No lock is held across the network: the owner's branch is read first, and the task's
lock only guards the check-and-start that follows (ADR 0016). A cancel or a moved lease
reaches a runner on gossip (the owner retracts or re-publishes the `assign` key), not by
polling the owner."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from kovanex.agent.context import NodeContext
from kovanex.agent.deadline import PlacementDeadline
from kovanex.agent.executor import TaskRun
from kovanex.agent.remote import RemoteLedger
from kovanex.agent.replication.manager import ReplicaManager
from kovanex.agent.runs import RunTable
from kovanex.agent.scheduling import TaskLocks
from kovanex.core import remoterun as core
from kovanex.core import task as taskcore
from kovanex.core.decider import Driver
from kovanex.core.task import TaskView
from kovanex.gitstate.ledger import Lease
from kovanex.gitstate.store import CasConflict, StaleEpoch
from kovanex.net.gossip import GossipNode

log = logging.getLogger("kovanex.agent")
ASSIGN = "assign"  # gossip topic: an owner placed one of its tasks on a node
REDELIVER_S = core.REDELIVER_S
REDELIVER_MAX = core.REDELIVER_MAX


class RemoteRuns:
    def __init__(
        self,
        ctx: NodeContext,
        runs: RunTable,
        locks: TaskLocks,
        deadline: PlacementDeadline,
        gossip: GossipNode,
        replicas: ReplicaManager,
    ) -> None:
        self.ctx = ctx
        self.runs = runs
        self.locks = locks
        self.deadline = deadline
        self.gossip = gossip
        self.replicas = replicas
        self.assignments: dict[str, str] = {}  # repo -> owner base URL, from assign records
        self._watched: dict[tuple[str, str], tuple[TaskRun, RemoteLedger]] = {}
        self.core = Driver(
            core.decide,
            core.RemoteRunState(ctx.name, redeliver_s=REDELIVER_S, redeliver_max=REDELIVER_MAX),
        )

    def start(self) -> None:
        """Subscribe, then deliver what gossip already holds for us: the agent joins the
        cluster before this service starts (coordination and token sync start between),
        and an owner that places a task on a node the moment it joins sends the
        assignment into that window. Nothing would call back for it, and the owner would
        exclude us at its placement deadline (seen under load: a new runner never ran
        the task that waited for it)."""
        self.gossip.subscribe(ASSIGN, self._on_assign)
        self.recheck("it came before this node listened for assignments")

    def owner_url(self, repo: str) -> str:
        """The owner's git URL for a repo we run tasks of (looked up fresh each time)."""
        o = self.replicas.owner_of(repo)
        if o is not None:
            return o[1]  # possibly our own URL, after we took the repo over
        a = self.assignments.get(repo)
        if a is None:
            raise LookupError(f"no known owner for repo {repo}")
        return f"{a}/git/{repo}.git"

    def owner_desc(self, repo: str) -> str:
        o = self.replicas.owner_of(repo)
        if o is None:
            return "its owner (not yet known to this node; see `kovanex repo status`)"
        return f"{o[0]} at {o[1]} (ownership epoch {o[2]})"

    # -- driving the core ------------------------------------------------------------------
    def _step(self, ev: core.Event) -> list[core.Effect]:
        return self.core.step(ev, self.ctx.clock.monotonic())

    def _spawn(self, coro: Any) -> None:
        asyncio.get_running_loop().create_task(coro)

    def _carry_out(self, effects: list[core.Effect]) -> None:
        """The effects that need no owner's branch in hand (those are `_start`'s, ...)."""
        for e in effects:
            if isinstance(e, core.LearnOwner):
                self.assignments[e.repo] = e.url
            elif isinstance(e, core.Start):
                if e.again:
                    log.info("%s/%s: its run crashed; starting it again", e.value["repo"],
                             e.value["task"])  # fmt: skip
                self._spawn(self._start(dict(e.value)))
            elif isinstance(e, core.Busy):
                log.info("%s/%s: assigned at epoch %s while a run of it is here", *e.key, e.epoch)
            elif isinstance(e, core.Supersede):
                self._spawn(self._supersede(self.runs.runs[e.key], e.epoch))
            elif isinstance(e, core.Verify):
                run, remote = self._watched[e.key]
                self._spawn(self._verify(run, remote))
            elif isinstance(e, core.RedeliverAt):
                self._spawn(self._redeliver(e.key, e.at))
            elif isinstance(e, core.HandBack):
                self._spawn(self.hand_back(*e.key, e.epoch, e.why))

    def _watching(self, key: tuple[str, str]) -> tuple[TaskRun, RemoteLedger] | None:
        """The run of `key` we watch, if it still runs here. The watch of a run that ended
        (stood down on its own when the lease moved, e.g. while we were cut off) is
        dropped: it counted as a run to verify, so the owner's next assignment of that
        task to us was verified against nothing and never started, and the owner
        excluded us at its deadline (issue 25 bug 9, KOVANEX_SEED=16)."""
        watched = self._watched.get(key)
        if watched is not None and self.runs.runs.get(key) is not watched[0]:
            del self._watched[key]
            return None
        return watched

    def _on_assign(self, topic: str, payload: Any) -> None:
        value = getattr(payload, "value", None)
        repo, _, task_id = str(getattr(payload, "key", "")).partition("/")
        watched = self._watching((repo, task_id))
        a = core.assignment(value)
        run = self.runs.runs.get(a[0]) if a is not None else None
        ev = core.AssignSeen(
            (repo, task_id),
            value,
            watched[0].lease.epoch if watched is not None else None,
            run.lease.epoch if run is not None else None,
        )
        self._carry_out(self._step(ev))

    async def _supersede(self, run: TaskRun, epoch: int) -> None:
        """A newer lease on us replaces the run here (a deposed owner's own run, which the
        new owner placed on us again): if the owner's branch confirms it (network, no
        lock), stand the old run down; `ran` then starts the new lease."""
        try:
            view = await asyncio.to_thread(self._ledger(run.lease.repo).read, run.lease.task_id)
        except Exception:  # noqa: BLE001 - owner unreachable: the old run's next CAS decides
            return
        for e in self._step(core.SupersedeRead(run.key, epoch, core.owner_lease(view))):
            if isinstance(e, core.StandDown):
                run.stand_down(e.reason)

    def ran(self, repo: str, task_id: str) -> None:
        """A run ended: start the assignment that waited for it, if any (`_start` checks it
        against the owner's branch, so a stale one is dropped there); a crashed one is
        delivered again, or handed back after too many crashes (the core decides)."""
        key = (repo, task_id)
        watched = self._watched.get(key)
        crashed = watched[0].lease.epoch if watched is not None and watched[0].crashed else None
        self._carry_out(self._step(core.RunEnded(key, key in self.runs.runs, crashed)))

    async def _redeliver(self, key: tuple[str, str], at: float) -> None:
        delay = at - self.ctx.clock.monotonic()
        if delay > 0:
            await self.ctx.clock.sleep(delay)
        value = self.gossip.get(ASSIGN, f"{key[0]}/{key[1]}")
        self._carry_out(self._step(core.RedeliverDue(key, value, key in self.runs.runs)))

    def demoted(self, repo: str, owner: str) -> None:
        """We lost `repo` to `owner` while running some of its tasks as their owner. Those
        runs write to our copy, which follows the new owner now, so nothing they commit
        would reach it, and the new owner sees a live holder and re-places nothing. Stand
        each down and hand its lease back; the owner places it again (here, if it is
        pinned here), and it resumes after its last finished step."""
        for key, run in sorted(self.runs.runs.items()):
            if key[0] == repo and run.remote is None:
                asyncio.get_running_loop().create_task(self._hand_over(run, owner))

    async def _hand_over(self, run: TaskRun, owner: str) -> None:
        why = f"{run.lease.repo} moved to {owner} while this ran on its old owner"
        run.stand_down(why)
        await run.ended.wait()  # standing down kills its step: it ends
        for delay in (1.0, 3.0, 0.0):  # our copy may not know the new owner's address yet
            if await self.hand_back(run.lease.repo, run.lease.task_id, run.lease.epoch, why):
                return
            await self.ctx.clock.sleep(delay)

    def recheck(self, why: str = "after the state sync") -> None:
        """Deliver again the assignments to us that are not running: one that came while our
        owner records were stale (back from a partition, before the state sync) was read
        from the wrong owner and dropped, and the owner would wait for its deadline."""
        for value in self.gossip.items(ASSIGN).values():
            if not isinstance(value, dict) or value.get("node") != self.ctx.name:
                continue
            key = (str(value.get("repo")), str(value.get("task")))
            if key not in self.runs.runs and self._watching(key) is None:
                log.info("%s/%s: assignment delivered (%s)", *key, why)
                self.assignments[key[0]] = value["url"]
                asyncio.get_running_loop().create_task(self._start(value))

    def _ledger(self, repo: str) -> RemoteLedger:
        return RemoteLedger(
            self.ctx.layout.root / "cache" / f"{repo}.git",
            lambda: self.owner_url(repo),
            self.ctx.token,
            self.ctx.name,
            clock=self.ctx.clock,
        )

    async def _requeue(
        self, remote: RemoteLedger, task_id: str, view: TaskView, reason: str
    ) -> bool:
        """Requeue the lease just read on the owner's branch; the epoch CAS refuses it if
        the lease moved meanwhile."""
        tr = taskcore.requeue(view, reason)
        try:
            await asyncio.to_thread(
                remote.append, task_id, tr, expected_tip=view.tip, lease_epoch=tr.epoch
            )
        except (CasConflict, StaleEpoch):
            return False
        return True

    async def hand_back(self, repo: str, task_id: str, epoch: int, why: str) -> bool:
        """Requeue on its (new) owner a task it says we hold at `epoch` though we run it no
        more: we halted it while cut off as its owner, and that requeue went to lost/ when
        we learnt of the takeover. The epoch CAS refuses it if the lease moved meanwhile."""
        remote = self._ledger(repo)
        try:  # network: before the lock
            view = await asyncio.to_thread(remote.read, task_id)
        except Exception as e:  # noqa: BLE001 - owner unreachable: the leader re-places it
            log.warning("%s/%s: cannot hand it back: %s", repo, task_id, e)
            return False
        key = (repo, task_id)
        ev = core.HandBackRead(key, epoch, why, core.owner_lease(view), key in self.runs.runs)
        for e in self._step(ev):
            if isinstance(e, core.Requeue) and await self._requeue(remote, task_id, view, e.reason):
                log.info("%s/%s handed back to its owner: %s", repo, task_id, why)
                return True
        return False

    async def _start(self, a: dict[str, Any]) -> None:
        repo, task_id, epoch = a["repo"], a["task"], int(a["epoch"])
        key = (repo, task_id)
        try:
            remote = self._ledger(repo)
        except Exception as e:  # noqa: BLE001 - e.g. the cache dir is unusable
            log.warning("%s/%s: cannot prepare a cache repo: %s", repo, task_id, e)
            self.deadline.report(repo, task_id, epoch, f"could not prepare: {e}")
            return
        view = None
        for delay in (0.2, 0.5, 0.0):  # a concurrent fetch into the cache fails one: retry
            try:  # network: before the lock
                view = await asyncio.to_thread(remote.read, task_id)
                break
            except Exception as e:  # noqa: BLE001 - owner unreachable: handled there
                log.warning("%s/%s: cannot read from owner: %s", repo, task_id, e)
                if not delay:
                    self.deadline.report(repo, task_id, epoch, fetch_failure(e))
                    return
                await self.ctx.clock.sleep(delay)
        assert view is not None
        for e in self._step(core.StartRead(key, epoch, core.owner_lease(view))):
            if isinstance(e, core.Stale):
                log.info("%s/%s: assignment at epoch %d is stale (%s@%d on %s)", repo, task_id,
                         epoch, view.node, view.epoch, self.owner_desc(repo))  # fmt: skip
            elif isinstance(e, core.Requeue):
                await self._requeue(remote, task_id, view, e.reason)
            elif isinstance(e, core.RunHere):
                await self._run_here(key, epoch, remote)

    async def _run_here(self, key: tuple[str, str], epoch: int, remote: RemoteLedger) -> None:
        repo, task_id = key
        async with self.locks.of(key):  # local only: the check and the start
            if key in self.runs.runs:
                return
            if not self.runs.slots.try_acquire():
                self.deadline.report(repo, task_id, epoch, "had no free runner slot", exclude=False)
                return
            lease = Lease(task_id, self.ctx.name, epoch, repo=repo)
            run = self.runs.start(lease, remote, remote.cache, remote=remote)
        self._watch(run, remote)

    def _watch(self, run: TaskRun, remote: RemoteLedger) -> None:
        """Listen for the owner's word on this lease: it retracts the `assign` key once
        the task is final (a cancel) or its lease ends, and re-assigns it on a move. No
        polling: the runner's next write is a CAS the owner refuses anyway (ADR 0031)."""
        self._watched = {
            k: (r, rl) for k, (r, rl) in self._watched.items() if self.runs.runs.get(k) is r
        }
        self._watched[run.key] = (run, remote)

    async def _verify(self, run: TaskRun, remote: RemoteLedger) -> None:
        """Read the owner's branch (network, no lock) and stand down if the lease moved."""
        if self.runs.runs.get(run.key) is not run or run.cancel.is_set():
            self._watched.pop(run.key, None)
            return
        try:
            view = await asyncio.to_thread(remote.read, run.lease.task_id)
        except Exception:  # noqa: BLE001 - owner unreachable: the next write decides
            return
        for e in self._step(core.VerifyRead(run.key, run.lease.epoch, core.owner_lease(view))):
            if isinstance(e, core.StandDown):
                self._watched.pop(run.key, None)
                run.stand_down(e.reason)


def fetch_failure(e: Exception) -> str:
    """One line for the reason trailer; git's stderr names the HTTP status on a 401/403."""
    text = str(e)
    if "Authentication failed" in text:  # git's wording for a 401 it has no credentials for
        return "could not fetch: 401 (this node's cluster token differs)"
    for code in ("401", "403", "404"):
        if f" {code}" in text or f"error: {code}" in text:
            hint = " (this node's cluster token differs)" if code in ("401", "403") else ""
            return f"could not fetch: {code}{hint}"
    last = text.strip().splitlines()[-1] if text.strip() else type(e).__name__
    return f"could not fetch: {last}"
