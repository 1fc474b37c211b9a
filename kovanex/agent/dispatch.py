"""Turn ref moves into reconciles: the dispatcher coalesces notifications (hooks, the
watchdog watcher, finished runs) and the sweeper re-reads everything now and then, as
anti-entropy for whatever bypassed both."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Awaitable, Callable

from kovanex.agent.replication.manager import ReplicaManager
from kovanex.agent.repos import RepoIndex
from kovanex.agent.scheduling import TaskScheduler
from kovanex.clock import SYSTEM, Clock

log = logging.getLogger("kovanex.agent")
# Anti-entropy sweep interval; KOVANEX_SWEEP_S overrides it (tests raise it to prove the
# watcher alone notices ref writes that bypass the hooks).
SWEEP_S = float(os.environ.get("KOVANEX_SWEEP_S", "5.0"))
# A ref move the watcher sees may be a push git is still finishing (its other refs, its
# hook); on 2 cores, starting the task at once slows the push itself. It also coalesces
# bursts. A post-receive (`Dispatcher.pushed`) needs none: the push's refs are all in.
SETTLE_S = 0.02


class Dispatcher:
    def __init__(
        self,
        repos: RepoIndex,
        scheduler: TaskScheduler,
        replicas: ReplicaManager,
        clock: Clock = SYSTEM,
    ) -> None:
        self.repos = repos
        self.clock = clock
        self.scheduler = scheduler
        self.replicas = replicas
        # repo -> task ids whose refs moved (None: scan the whole repo, e.g. packed-refs)
        self._dirty: dict[str, set[str] | None] = {}
        self._announce: set[str] = set()
        self._kick = asyncio.Event()
        self._settle = False
        self._pushed = asyncio.Event()  # a post-receive came: a settle under way may end

    def ran(self, repo: str, task_id: str) -> None:
        """A run ended and freed a slot: no push is in flight, so place at once."""
        self.changed(repo, task_id, settle=False)

    def pushed(self, repo: str, task_id: str) -> None:
        """A push's post-receive: every ref of that push is in (git runs the hook after its
        ref transaction), so there is nothing to settle for; only its process exits are
        left. Acting at once takes SETTLE_S off every task's start (ADR 0109); the
        watcher's notice of the same push usually comes first, during the push, and its
        settle ends here."""
        self.changed(repo, task_id, settle=False)
        self._pushed.set()

    def ref_moved(self, repo: str, task_id: str | None) -> None:
        """The watcher saw a ref move. Our own write's echo (the tip we just wrote) needs
        no reconcile and no settle, only an announcement to the replicas: otherwise every
        commit of a busy node would delay the next placement by SETTLE_S."""
        if task_id and repo:
            try:
                ours = self.scheduler.tips.get((repo, task_id))
                echo = ours is not None and self.repos.ledger(repo).tip(task_id) == ours
            except Exception:  # noqa: BLE001 - unknown repo: treat it as a real move
                echo = False
            if echo:
                self.changed(repo, "", settle=False)
                return
        self.changed(repo, task_id)

    def changed(self, repo: str, task_id: str | None = None, settle: bool = True) -> None:
        """Note a moved ref; a known task id avoids re-listing every task of the repo, and
        "" (a non-task ref, or no repo at all) only needs announcing / a placement pass.
        `settle`: a push may still be finishing, so wait SETTLE_S before acting."""
        self._settle = self._settle or settle
        if task_id == "":
            if repo:
                self._announce.add(repo)
        elif task_id is None:
            if repo:
                self._dirty[repo] = None
        elif repo not in self._dirty:
            self._dirty[repo] = {task_id}
        elif self._dirty[repo] is not None:
            self._dirty[repo].add(task_id)  # type: ignore[union-attr]
        self._kick.set()

    async def settle(self) -> None:
        """Wait SETTLE_S for a push git may still be finishing, or until a post-receive
        says its refs are all in, whichever comes first."""
        with contextlib.suppress(TimeoutError):
            await self.clock.wait_for(self._pushed.wait(), SETTLE_S)

    def _tell_replicas(self, repo: str) -> None:
        if self.replicas.has_replicas(repo):
            self.replicas.refs_changed(repo)
            self.replicas.nudge_replicas(repo)

    async def run(self) -> None:
        while True:
            await self._kick.wait()
            if self._settle:
                await self.settle()
            self._pushed.clear()  # what it said is in this pass
            self._kick.clear()
            self._settle = False
            dirty, self._dirty = self._dirty, {}
            announce, self._announce = self._announce, set()
            owned = set(self.repos.owned())
            for repo in sorted(announce - set(dirty)):
                if repo in owned:
                    self._tell_replicas(repo)
            for repo, tasks in sorted(dirty.items()):
                if repo not in owned:
                    continue
                self._tell_replicas(repo)
                if tasks is None:
                    await self.scheduler.reconcile_repo(repo)
                    continue
                ledger = self.repos.ledger(repo)
                moved = []
                for task_id in sorted(tasks):
                    tip = ledger.tip(task_id)
                    if tip is not None and tip != self.scheduler.tips.get((repo, task_id)):
                        moved.append(task_id)
                await self.scheduler.reconcile_tasks(repo, moved)
            await self.scheduler.schedule_pending()


class Sweeper:
    """Anti-entropy: a periodic read of the refs catches anything missed; what it reads is
    the tasks in flight, and every task ref only when the ref store changed."""

    def __init__(
        self,
        repos: RepoIndex,
        scheduler: TaskScheduler,
        watch: Callable[[str], None],
        fence: Callable[[], Awaitable[None]],
        every: float = SWEEP_S,
        clock: Clock = SYSTEM,
        busy: Callable[[str], bool] = lambda repo: False,
    ) -> None:
        self.repos = repos
        self.clock = clock
        self.scheduler = scheduler
        self.watch = watch
        self.fence = fence
        self.every = every
        # upkeep is rewriting this repo's refs (an archive, pack-refs); its loose refs
        # change by the thousand, and the repo is read once when it is done
        self.busy = busy

    async def sweep(self) -> None:
        for repo in self.repos.refresh():
            self.watch(repo)
        for repo in self.repos.owned():
            await self.scheduler.sweep_repo(repo, listing=not self.busy(repo))
        await self.fence()
        await self.scheduler.schedule_pending()

    async def run(self) -> None:
        while True:
            await self.clock.sleep(self.every)
            try:
                await self.sweep()
            except Exception:
                log.exception("sweep failed")
