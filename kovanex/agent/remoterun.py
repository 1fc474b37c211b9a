"""Runs of other owners' tasks (ADR 0008): an owner assigns us a lease over gossip; we
read and write its branch over HTTP through a cache repo, and watch for a cancel.

No lock is held across the network: the owner's branch is read first, and the task's
lock only guards the check-and-start that follows (ADR 0016). A cancel or a moved lease
reaches a runner on gossip (the owner retracts or re-publishes the `assign` key), not by
polling the owner."""

from __future__ import annotations

import asyncio
import collections
import logging
from typing import Any

from kovanex.agent.context import NodeContext
from kovanex.agent.deadline import PlacementDeadline
from kovanex.agent.executor import TaskRun
from kovanex.agent.remote import RemoteLedger
from kovanex.agent.runs import RunTable
from kovanex.agent.scheduling import TaskLocks
from kovanex.core import task as taskcore
from kovanex.gitstate.ledger import Lease
from kovanex.gitstate.store import CasConflict, StaleEpoch
from kovanex.net.gossip import GossipNode

log = logging.getLogger("kovanex.agent")
ASSIGN = "assign"  # gossip topic: an owner placed one of its tasks on a node
REDELIVER_S = 2.0  # after a remote run crashed, before its assignment is tried again
REDELIVER_MAX = 3  # crashes of a task's runs here retried here; then it goes back to its owner


class RemoteRuns:
    def __init__(
        self,
        ctx: NodeContext,
        runs: RunTable,
        locks: TaskLocks,
        deadline: PlacementDeadline,
        gossip: GossipNode,
        replicas: Any,
    ) -> None:
        self.ctx = ctx
        self.runs = runs
        self.locks = locks
        self.deadline = deadline
        self.gossip = gossip
        self.replicas = replicas
        self.assignments: dict[str, str] = {}  # repo -> owner base URL, from assign records
        self._watched: dict[tuple[str, str], tuple[TaskRun, RemoteLedger]] = {}
        # assignments to us that came while an older run of the task was here (our own
        # run as a deposed owner): started once that run ends (`ran`)
        self._pending: dict[tuple[str, str], dict[str, Any]] = {}
        self._crashes: collections.Counter[tuple[str, str]] = collections.Counter()

    def start(self) -> None:
        self.gossip.subscribe(ASSIGN, self._on_assign)

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

    def _on_assign(self, topic: str, payload: Any) -> None:
        value = getattr(payload, "value", None)
        repo, _, task_id = str(getattr(payload, "key", "")).partition("/")
        watched = self._watched.get((repo, task_id))
        if watched is not None:
            run, remote = watched
            mine = isinstance(value, dict) and (value.get("node"), value.get("epoch")) == (
                self.ctx.name,
                run.lease.epoch,
            )
            if not mine:  # retracted (final: cancelled...) or moved elsewhere: verify
                asyncio.get_running_loop().create_task(self._verify(run, remote))
                return
        if not isinstance(value, dict) or value.get("node") != self.ctx.name:
            return
        self.assignments[value["repo"]] = value["url"]
        if (value["repo"], value["task"]) not in self.runs.runs:
            asyncio.get_running_loop().create_task(self._start(value))
        else:
            key = (value["repo"], value["task"])
            log.info("%s/%s: assigned at epoch %s while a run of it is here", repo, task_id,
                     value.get("epoch"))  # fmt: skip
            run = self.runs.runs[key]
            if int(value.get("epoch", 0)) > run.lease.epoch:  # not our own run's echo
                self._pending[key] = value
                asyncio.get_running_loop().create_task(self._supersede(run, value))

    async def _supersede(self, run: TaskRun, a: dict[str, Any]) -> None:
        """A newer lease on us replaces the run here (a deposed owner's own run, which the
        new owner placed on us again): if the owner's branch confirms it (network, no
        lock), stand the old run down; `ran` then starts the new lease."""
        try:
            view = await asyncio.to_thread(self._ledger(run.lease.repo).read, run.lease.task_id)
        except Exception:  # noqa: BLE001 - owner unreachable: the old run's next CAS decides
            return
        if (view.node, view.epoch) == (self.ctx.name, int(a["epoch"])) and view.state in (
            taskcore.PLACED,
            taskcore.RUNNING,
        ):
            run.stand_down(f"lease moved on the owner: {view.state} {view.node}@{view.epoch}")

    def ran(self, repo: str, task_id: str) -> None:
        """A run ended: start the assignment that waited for it, if any (`_start` checks it
        against the owner's branch, so a stale one is dropped there)."""
        value = self._pending.pop((repo, task_id), None)
        if value is not None and (repo, task_id) not in self.runs.runs:
            asyncio.get_running_loop().create_task(self._start(value))
            return
        watched = self._watched.get((repo, task_id))
        if watched is not None and watched[0].crashed:
            self._crashes[(repo, task_id)] += 1
            if self._crashes[(repo, task_id)] > REDELIVER_MAX:
                why = f"its runs on {self.ctx.name} crashed {REDELIVER_MAX} times"
                epoch = watched[0].lease.epoch
                asyncio.get_running_loop().create_task(self.hand_back(repo, task_id, epoch, why))
                return
            # e.g. the owner unreachable for a moment just after a heal: nothing on the
            # owner's side re-places a lease whose holder is alive, so deliver it again
            asyncio.get_running_loop().create_task(self._redeliver((repo, task_id)))

    async def _redeliver(self, key: tuple[str, str]) -> None:
        await self.ctx.clock.sleep(REDELIVER_S)
        value = self.gossip.get(ASSIGN, f"{key[0]}/{key[1]}")
        if isinstance(value, dict) and value.get("node") == self.ctx.name:
            if key not in self.runs.runs:
                log.info("%s/%s: its run crashed; starting it again", *key)
                await self._start(value)  # a lease still `running` is handed back there

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

    def recheck(self) -> None:
        """Deliver again the assignments to us that are not running: one that came while our
        owner records were stale (back from a partition, before the state sync) was read
        from the wrong owner and dropped, and the owner would wait for its deadline."""
        for value in self.gossip.items(ASSIGN).values():
            if not isinstance(value, dict) or value.get("node") != self.ctx.name:
                continue
            key = (str(value.get("repo")), str(value.get("task")))
            if key not in self.runs.runs and key not in self._watched:
                log.info("%s/%s: assignment delivered again after the state sync", *key)
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
        held = view.state in (taskcore.PLACED, taskcore.RUNNING)
        if not held or (view.node, view.epoch) != (self.ctx.name, epoch):
            return False
        if (repo, task_id) in self.runs.runs:
            return False
        tr = taskcore.requeue(view, why)
        try:
            await asyncio.to_thread(
                remote.append, task_id, tr, expected_tip=view.tip, lease_epoch=tr.epoch
            )
        except (CasConflict, StaleEpoch):
            return False
        log.info("%s/%s handed back to its owner: %s", repo, task_id, why)
        return True

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
        if view.node != self.ctx.name or view.epoch != epoch:
            log.info("%s/%s: assignment at epoch %d is stale (%s@%d on %s)", repo, task_id,
                     epoch, view.node, view.epoch, self.owner_desc(repo))  # fmt: skip
            return
        if view.state == taskcore.RUNNING:
            # we held this lease before a restart: hand it back under a new epoch
            tr = taskcore.requeue(view, f"agent {self.ctx.name} restarted; rescheduling")
            try:
                await asyncio.to_thread(
                    remote.append, task_id, tr, expected_tip=view.tip, lease_epoch=tr.epoch
                )
            except (CasConflict, StaleEpoch):
                pass
            return
        if view.state != taskcore.PLACED:
            return
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
        if (
            view.epoch != run.lease.epoch
            or view.node != self.ctx.name
            or view.state not in (taskcore.PLACED, taskcore.RUNNING)
        ):
            self._watched.pop(run.key, None)
            run.stand_down(f"lease moved on the owner: {view.state} {view.node}@{view.epoch}")


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
