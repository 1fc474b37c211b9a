"""Cross-node leases (a mixin of Agent): assignments to remote runners, runs of other
owners' tasks, and requeueing the leases of failed nodes (ADR 0008)."""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from kovanex.agent.executor import Lease, TaskRun
from kovanex.agent.remote import RemoteLedger
from kovanex.core import startwatch
from kovanex.core import task as taskcore
from kovanex.gitstate.store import CasConflict, StaleEpoch

if TYPE_CHECKING:
    from kovanex.agent.daemon import Agent

    _Base = Agent
else:
    _Base = object

log = logging.getLogger("kovanex.agent")
START_FAILED = "start-failed"  # gossip topic: a runner could not start a lease it was given


class Failover(_Base):
    def on_member_event(self, topic: str, member: Any) -> None:
        """Membership changed: capacity may have appeared, or a lease holder died."""
        if topic in ("member-failed", "member-leave"):
            asyncio.get_running_loop().create_task(self.requeue_held_by(member.name))
        self._on_ref_change("")

    def member_status(self, name: str) -> str | None:
        if self.cluster is None:
            return None
        for m in self.cluster.node.members():
            if m.name == name:
                return m.status
        return None

    async def requeue_held_by(self, dead: str) -> None:
        """Every task a failed node held is queued again under a new epoch; the next
        holder resumes after the last step commit, and the old holder is fenced out."""
        for repo in self.owned_repos():
            ledger = self.ledger(repo)
            for task_id in ledger.list_tasks():
                key = (repo, task_id)
                async with self.locks.setdefault(key, asyncio.Lock()):
                    view = ledger.read(task_id)
                    if view.node != dead or view.state not in (taskcore.PLACED, taskcore.RUNNING):
                        continue
                    tr = taskcore.requeue(view, f"node {dead} failed; rescheduling")
                    try:
                        tip = ledger.append(
                            task_id, tr, expected_tip=view.tip, lease_epoch=tr.epoch
                        )
                    except (CasConflict, StaleEpoch):
                        continue
                    log.info("%s/%s requeued: holder %s failed", repo, task_id, dead)
                    self.tips[key] = tip
                    self.pending[key] = (tip, self._priority(key))
        self._on_ref_change("")

    def owner_url(self, repo: str) -> str:
        """The owner's git URL for a repo we run tasks of (looked up fresh each time)."""
        if self.replicas is not None:
            o = self.replicas.owner_of(repo)
            if o is not None:
                return o[1]  # possibly our own URL, after we took the repo over
        a = self.assignments.get(repo)
        if a is None:
            raise LookupError(f"no known owner for repo {repo}")
        return f"{a}/git/{repo}.git"

    def owner_desc(self, repo: str) -> str:
        o = self.replicas.owner_of(repo) if self.replicas is not None else None
        if o is None:
            return "its owner (not yet known to this node; see `kovanex repo status`)"
        return f"{o[0]} at {o[1]} (ownership epoch {o[2]})"

    def _on_assign(self, topic: str, payload: Any) -> None:
        value = getattr(payload, "value", None)
        if not isinstance(value, dict) or value.get("node") != self.node:
            return
        self.assignments[value["repo"]] = value["url"]
        key = (value["repo"], value["task"])
        if key in self.runs:
            return
        asyncio.get_running_loop().create_task(self._start_remote(value))

    async def _start_remote(self, a: dict[str, Any]) -> None:
        repo, task_id, epoch = a["repo"], a["task"], int(a["epoch"])
        key = (repo, task_id)
        async with self.locks.setdefault(key, asyncio.Lock()):
            if key in self.runs:
                return
            try:
                remote = RemoteLedger(
                    self.layout.root / "cache" / f"{repo}.git",
                    lambda: self.owner_url(repo),
                    self.token,
                    self.node,
                )
            except Exception as e:  # noqa: BLE001 - e.g. the cache dir is unusable
                log.warning("%s/%s: cannot prepare a cache repo: %s", repo, task_id, e)
                self.report_start_failure(repo, task_id, epoch, f"could not prepare: {e}")
                return
            try:
                view = await asyncio.to_thread(remote.read, task_id)
            except Exception as e:  # noqa: BLE001 - owner unreachable: its failure is handled there
                log.warning("%s/%s: cannot read from owner: %s", repo, task_id, e)
                self.report_start_failure(repo, task_id, epoch, fetch_failure(e))
                return
            if view.node != self.node or view.epoch != epoch:
                return
            if view.state == taskcore.RUNNING:
                # we held this lease before a restart: hand it back under a new epoch
                tr = taskcore.requeue(view, f"agent {self.node} restarted; rescheduling")
                try:
                    await asyncio.to_thread(
                        remote.append, task_id, tr, expected_tip=view.tip, lease_epoch=tr.epoch
                    )
                except (CasConflict, StaleEpoch):
                    pass
                return
            if view.state != taskcore.PLACED:
                return
            if not self.slots.try_acquire():
                self.report_start_failure(
                    repo, task_id, epoch, "had no free runner slot", exclude=False
                )
                return
            run = TaskRun(self, Lease(repo, task_id, self.node, epoch), remote=remote)
            self.runs[key] = run
            asyncio.create_task(run.run())
            asyncio.create_task(self._watch_remote(run, remote))

    async def _watch_remote(self, run: TaskRun, remote: RemoteLedger) -> None:
        """Notice a cancel or a move on the owner while a long step runs."""
        from kovanex.gitstate import mirror

        ref = f"refs/heads/task/{run.lease.task_id}"
        while run.key in self.runs and not run.cancel.is_set():
            await asyncio.sleep(1.0)
            try:
                refs = await asyncio.to_thread(mirror.ls_remote, remote.owner_url(), self.token)
            except Exception:  # noqa: BLE001 - transient; the next write decides anyway
                continue
            if refs.get(ref) not in (None, remote.tip(run.lease.task_id)):
                try:
                    view = await asyncio.to_thread(remote.read, run.lease.task_id)
                except Exception:  # noqa: BLE001
                    continue
                if view.epoch != run.lease.epoch or view.node != self.node:
                    run.stand_down(
                        f"lease moved on the owner: {view.state} {view.node}@{view.epoch}"
                    )

    async def _lease_guard(self) -> None:
        """Confirm a suspect lease holder's crash early: on loopback or a LAN, a refused
        TCP connect to its HTTP port means no agent is listening. A timeout (partition,
        pause) proves nothing, so those wait for SWIM's dead; epochs fence either way."""
        confirmed: set[tuple[str, int]] = set()
        while True:
            await asyncio.sleep(0.2)
            if self.cluster is None:
                continue
            for m in self.cluster.node.members():
                if m.status != "suspect" or m.name == self.node:
                    continue
                token = (m.name, m.incarnation)
                http = (m.meta or {}).get("http", "")
                if token in confirmed or not http.startswith("http://"):
                    continue
                host, _, port = http[len("http://") :].rpartition(":")
                try:
                    _r, w = await asyncio.wait_for(
                        asyncio.open_connection(host, int(port)), timeout=0.3
                    )
                    w.close()
                    continue  # something answers: let SWIM decide
                except ConnectionRefusedError:
                    confirmed.add(token)
                    log.info(
                        "suspect %s refuses connections on %s: its agent is gone", m.name, http
                    )
                    self.cluster.record(
                        "lease-guard", {"member": m.name, "msg": "connection refused"}
                    )
                    await self.requeue_held_by(m.name)
                except (OSError, TimeoutError, ValueError):
                    continue

    async def _fence_dead_holders(self) -> None:
        """Backstop for a missed member-failed event: requeue leases of dead/left nodes."""
        dead = set()
        for repo in self.owned_repos():
            ledger = self.ledger(repo)
            for task_id in ledger.list_tasks():
                view = ledger.read(task_id)
                if view.state in (taskcore.PLACED, taskcore.RUNNING) and view.node != self.node:
                    if self.member_status(view.node) in ("dead", "left"):
                        dead.add(view.node)
        for name in sorted(dead):
            await self.requeue_held_by(name)

    # -- placement deadline (ADR 0012) ------------------------------------------------
    def report_start_failure(
        self, repo: str, task_id: str, epoch: int, reason: str, exclude: bool = True
    ) -> None:
        """Tell the owner why we cannot start its lease: we may not be able to write to
        its repo (that is often the very failure), but gossip reaches it."""
        if self.cluster is None:
            return
        self.cluster.node.publish(
            START_FAILED,
            self.node,  # one record per runner keeps gossip state bounded by cluster size
            {
                "repo": repo,
                "task": task_id,
                "node": self.node,
                "epoch": epoch,
                "reason": reason,
                "exclude": exclude,
            },
        )

    def _on_start_failed(self, topic: str, payload: Any) -> None:
        """Keep each report as it arrives: the runner's next report replaces its record."""
        f = _failure_of(getattr(payload, "value", None))
        if f is not None and f[0][0] in self.owned_repos():
            self.start_failures[f[0]] = f[1]
            self._lease_kick.set()

    def watch_lease(self, key: tuple[str, str], view: taskcore.TaskView) -> None:
        """Start the deadline clock for a placed lease (or drop it once it runs)."""
        w = startwatch.watch(view, self.lease_watches.get(key), self._clock())
        if w is None:
            self.lease_watches.pop(key, None)
        else:
            self.lease_watches[key] = w
            self._lease_kick.set()

    def placement_deadline(self) -> float:
        return self.cluster.node.profile.placement_deadline if self.cluster else 10.0

    def _clock(self) -> float:
        return asyncio.get_running_loop().time()

    def _reported_failure(self, key: tuple[str, str]) -> startwatch.StartFailure | None:
        """A report delivered to us, or one still held in gossip state (after a restart)."""
        if key in self.start_failures:
            return self.start_failures[key]
        if self.cluster is None:
            return None
        for v in self.cluster.node.items(START_FAILED).values():
            f = _failure_of(v)
            if f is not None and f[0] == key:
                return f[1]
        return None

    async def _placement_guard(self) -> None:
        """Wake at the earliest deadline (or on a runner's report) and requeue what is due."""
        while True:
            now = self._clock()
            dues = [w.since + self.placement_deadline() for w in self.lease_watches.values()]
            wait = min([d - now for d in dues] + [1.0])
            self._lease_kick.clear()
            try:
                await asyncio.wait_for(self._lease_kick.wait(), max(wait, 0.01))
            except TimeoutError:
                pass
            try:
                await self.check_leases()
            except Exception:
                log.exception("placement deadline check failed")

    async def check_leases(self) -> None:
        deadline = self.placement_deadline()
        moved = False
        for key in list(self.lease_watches):
            w = self.lease_watches.get(key)
            failure = self._reported_failure(key)
            if w is None:
                continue
            if self._clock() - w.since < deadline and (
                failure is None or (failure.node, failure.epoch) != (w.node, w.epoch)
            ):
                continue
            repo, task_id = key
            async with self.locks.setdefault(key, asyncio.Lock()):
                ledger = self.ledger(repo)
                view = ledger.read(task_id)
                now = self._clock()
                w = startwatch.watch(view, w, now)
                if w is None:
                    self.lease_watches.pop(key, None)
                    self.start_failures.pop(key, None)
                    continue
                self.lease_watches[key] = w
                tr = startwatch.decide(
                    view, w, now, deadline, failure, self.placer.excluded(repo, task_id)
                )
                if tr is None:
                    continue
                try:
                    tip = ledger.append(task_id, tr, expected_tip=view.tip, lease_epoch=tr.epoch)
                except (CasConflict, StaleEpoch):
                    continue
                self.lease_watches.pop(key, None)
                self.start_failures.pop(key, None)
                log.warning("%s/%s requeued: %s", repo, task_id, tr.reason)
                if self.cluster is not None:
                    self.cluster.record(
                        "requeue", {"repo": repo, "task": task_id, "msg": tr.reason}
                    )
                self.tips[key] = tip
                self.pending[key] = (tip, self._priority(key))
                moved = True
        for key in [k for k in self.start_failures if k not in self.lease_watches]:
            del self.start_failures[key]  # a report for a lease that is no longer placed
        if moved:
            self._on_ref_change("")


def _failure_of(v: Any) -> tuple[tuple[str, str], startwatch.StartFailure] | None:
    if not isinstance(v, dict):
        return None
    try:
        key = (str(v["repo"]), str(v["task"]))
        return key, startwatch.StartFailure(
            str(v["node"]), int(v["epoch"]), str(v["reason"]), bool(v.get("exclude", True))
        )
    except (KeyError, TypeError, ValueError):
        return None


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
