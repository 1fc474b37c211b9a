"""No task stuck in `placed` (ADR 0012): the owner watches each lease it handed out until
its holder starts it, and takes it back at the deadline or on the runner's own report.
The rule is `core/startwatch.py`; this service keeps the watches and the reports."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from kovanex.agent.context import NodeContext
from kovanex.agent.placement import Placer
from kovanex.agent.repos import RepoIndex
from kovanex.agent.scheduling import TaskLocks
from kovanex.core import startwatch
from kovanex.core import task as taskcore
from kovanex.gitstate.ledger import KeepsChanging, NoSuchTask, decide_and_append
from kovanex.net.gossip import GossipNode

log = logging.getLogger("kovanex.agent")
START_FAILED = "start-failed"  # gossip topic: a runner could not start a lease it was given
Key = tuple[str, str]


class PlacementDeadline:
    def __init__(
        self,
        ctx: NodeContext,
        repos: RepoIndex,
        placer: Placer,
        locks: TaskLocks,
        gossip: GossipNode,
        *,
        requeued: Callable[[str, str], None] = lambda repo, task: None,
        record: Callable[[str, dict[str, Any]], None] = lambda kind, data: None,
    ) -> None:
        self.ctx = ctx
        self.repos = repos
        self.placer = placer
        self.locks = locks
        self.gossip = gossip
        self.watches: dict[Key, startwatch.Watch] = {}
        self.failures: dict[Key, startwatch.StartFailure] = {}
        self._kick = asyncio.Event()
        self.requeued = requeued  # a requeue was written (the scheduler takes it in)
        self.record = record  # an event for the cluster's stream

    def start(self) -> None:
        self.gossip.subscribe(START_FAILED, self._on_start_failed)

    def deadline(self) -> float:
        return self.gossip.profile.placement_deadline

    def _now(self) -> float:
        return self.ctx.clock.monotonic()

    def watch(self, key: Key, view: taskcore.TaskView) -> None:
        """Start the deadline clock for a placed lease (or drop it once it runs)."""
        w = startwatch.watch(view, self.watches.get(key), self._now())
        if w is None:
            self.watches.pop(key, None)
        else:
            self.watches[key] = w
            self._kick.set()

    # -- runner side ---------------------------------------------------------------------
    def report(
        self, repo: str, task_id: str, epoch: int, reason: str, exclude: bool = True
    ) -> None:
        """Tell the owner why we cannot start its lease: we may not be able to write to
        its repo (that is often the very failure), but gossip reaches it."""
        self.gossip.publish(
            START_FAILED,
            self.ctx.name,  # one record per runner keeps gossip state bounded by cluster size
            {
                "repo": repo,
                "task": task_id,
                "node": self.ctx.name,
                "epoch": epoch,
                "reason": reason,
                "exclude": exclude,
            },
        )

    # -- owner side ----------------------------------------------------------------------
    def _on_start_failed(self, topic: str, payload: Any) -> None:
        """Keep each report as it arrives: the runner's next report replaces its record."""
        f = failure_of(getattr(payload, "value", None))
        if f is not None and f[0][0] in self.repos.owned():
            self.failures[f[0]] = f[1]
            self._kick.set()

    def _reported(self, key: Key) -> startwatch.StartFailure | None:
        """A report delivered to us, or one still held in gossip state (after a restart)."""
        if key in self.failures:
            return self.failures[key]
        for v in self.gossip.items(START_FAILED).values():
            f = failure_of(v)
            if f is not None and f[0] == key:
                return f[1]
        return None

    async def guard(self) -> None:
        """Wake at the earliest deadline (or on a runner's report) and requeue what is due."""
        while True:
            now = self._now()
            dues = [w.since + self.deadline() for w in self.watches.values()]
            wait = min([d - now for d in dues] + [1.0])
            self._kick.clear()
            try:
                await self.ctx.clock.wait_for(self._kick.wait(), max(wait, 0.01))
            except TimeoutError:
                pass
            try:
                await self.check()
            except Exception:
                log.exception("placement deadline check failed")

    async def check(self) -> bool:
        """Requeue every overdue or failed lease; True when one moved."""
        deadline = self.deadline()
        moved = False
        for key in list(self.watches):
            w = self.watches.get(key)
            failure = self._reported(key)
            if w is None:
                continue
            if self._now() - w.since < deadline and (
                failure is None or (failure.node, failure.epoch) != (w.node, w.epoch)
            ):
                continue
            repo, task_id = key
            async with self.locks.of(key):
                try:
                    tr = self._requeue_if_due(key, w, deadline, failure)
                except KeepsChanging:
                    continue  # busy: the next check looks again
                except NoSuchTask:  # e.g. a deposed owner's copy kept it under lost/ only:
                    self.watches.pop(key, None)  # not ours to requeue (it failed each second)
                    self.failures.pop(key, None)
                    continue
                if key not in self.watches:  # it started (or left placed) meanwhile
                    self.failures.pop(key, None)
                    continue
                if tr is None:
                    continue
                self.watches.pop(key, None)
                self.failures.pop(key, None)
                log.warning("%s/%s requeued: %s", repo, task_id, tr.reason)
                self.record("requeue", {"repo": repo, "task": task_id, "msg": tr.reason})
                self.requeued(repo, task_id)
                moved = True
        for key in [k for k in self.failures if k not in self.watches]:
            del self.failures[key]  # a report for a lease that is no longer placed
        return moved

    def _requeue_if_due(
        self, key: Key, w: startwatch.Watch, deadline: float, failure: Any
    ) -> taskcore.Transition | None:
        """The rule on a fresh read, appended by CAS (one helper with the API's writes)."""
        repo, task_id = key

        def decide(view: taskcore.TaskView) -> taskcore.Transition | None:
            now = self._now()
            cur = startwatch.watch(view, w, now)
            if cur is None:
                self.watches.pop(key, None)
                return None
            self.watches[key] = cur
            excluded = self.placer.excluded(repo, task_id)
            return startwatch.decide(view, cur, now, deadline, failure, excluded)

        return decide_and_append(self.repos.ledger(repo), task_id, decide)[1]


def failure_of(v: Any) -> tuple[Key, startwatch.StartFailure] | None:
    if not isinstance(v, dict):
        return None
    try:
        key = (str(v["repo"]), str(v["task"]))
        return key, startwatch.StartFailure(
            str(v["node"]), int(v["epoch"]), str(v["reason"]), bool(v.get("exclude", True))
        )
    except (KeyError, TypeError, ValueError):
        return None
