"""The owner's scheduling shell: reads branches, asks the placer, carries out what the
scheduler decider (`core/scheduler.py`) returns.

Every decision is the core's; this service only gathers its inputs (a task's view, the
placer's decision, whether a slot is free) and executes its effects, stopping at the
first refused write and asking again on what the branch says now.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from kovanex import spec as specmod
from kovanex.agent.context import NodeContext
from kovanex.agent.executor import kill_orphan
from kovanex.agent.placement import Placer
from kovanex.agent.repos import RepoIndex
from kovanex.agent.runs import RunTable
from kovanex.agent.serverplace import ServerPlacement
from kovanex.core import scheduler
from kovanex.core import task as taskcore
from kovanex.core.effects import (
    Assign,
    KillOrphan,
    QueueSubmission,
    StandDown,
    StartRun,
    WriteRef,
)
from kovanex.gitstate import tipscan
from kovanex.gitstate.ledger import Chain, Lease, NoSuchTask, task_id_of, transition_of
from kovanex.gitstate.refs import TASK_PREFIX, task_ref
from kovanex.gitstate.store import CasConflict, StaleEpoch, StaleTerm
from kovanex.pushcheck import (
    PushOptions,
    RefUpdate,
    is_skipped,
    queue_submission,
    queued_transition,
    record_push,
)

log = logging.getLogger("kovanex.agent")
Key = tuple[str, str]


class TaskLocks:
    """One lock per task: a decision and its write happen without another in between.
    Never held across network I/O (ADR 0016): callers fetch first, then lock."""

    def __init__(self) -> None:
        self._locks: dict[Key, asyncio.Lock] = {}

    def of(self, key: Key) -> asyncio.Lock:
        return self._locks.setdefault(key, asyncio.Lock())


class TaskScheduler:
    def __init__(
        self,
        ctx: NodeContext,
        repos: RepoIndex,
        runs: RunTable,
        placer: Placer,
        server_placement: ServerPlacement,
        locks: TaskLocks,
        *,
        watch_lease: Callable[[Key, taskcore.TaskView], None] = lambda key, view: None,
        announce: Callable[[Assign], None] = lambda a: None,
        kick: Callable[[str], None] = lambda repo: None,
        can_place_remotely: Callable[[], bool] = lambda: False,
        on_placed: Callable[[float], None] = lambda seconds: None,
        lease_over: Callable[[str, taskcore.TaskView], None] = lambda repo, view: None,
        grant: Callable[[specmod.TaskSpec, str], dict[str, str] | None] = lambda spec, repo: {},
    ) -> None:
        self.ctx = ctx
        self.repos = repos
        self.runs = runs
        self.placer = placer
        self.server_placement = server_placement
        self.locks = locks
        self.core = scheduler.Scheduler(ctx.name)
        self.tips: dict[Key, str] = {}
        # tasks not final when last seen (queued, leased, running): all a sweep re-reads
        # while the repo's refs have not changed (ADR 0030)
        self.active: set[Key] = set()
        self._stamps: dict[str, tuple[int, ...]] = {}
        # push options seen at pre-receive, keyed by (repo, task, new oid): the watchdog may
        # notice the ref move before post-receive arrives, and must still honour them.
        self.push_opts: dict[tuple[str, str, str], PushOptions] = {}
        self.watch_lease = watch_lease  # the placement deadline guards a handed-out lease
        self.announce = announce  # gossip `assign` for a remote runner
        self.kick = kick  # the dispatcher: a placement pass
        self.can_place_remotely = can_place_remotely
        self.on_placed = on_placed  # metrics
        self.lease_over = lease_over  # retract the lease's `assign`
        # the quorum gate: None waits; else trailers the placement carries (the term)
        self.grant = grant

    @property
    def pending(self) -> dict[Key, tuple[str, int]]:
        return self.core.pending

    def saw_tip(self, repo: str, task_id: str, tip: str) -> None:
        self.tips[(repo, task_id)] = tip

    def priority(self, key: Key) -> int:
        ledger = self.repos.ledger(key[0])
        tip = ledger.tip(key[1])
        if tip is None:
            return scheduler.DEFAULT_PRIORITY
        return scheduler.priority_of(transition_of(c.message) for c in ledger.store.walk(tip))

    # -- reconcile: what a branch says now -------------------------------------------------
    async def reconcile_all(self) -> None:
        for repo in self.repos.owned():
            await self.reconcile_repo(repo, force=True)
        await self.schedule_pending()

    async def reconcile_repo(self, repo: str, force: bool = False) -> None:
        if not self.repos.path(repo).exists():
            return
        if force:
            await self._reconcile_from_tips(repo)
            return
        # a `git for-each-ref` of every task ref: at 100,000 loose refs (a first archive
        # under way) it takes seconds, and on the loop it kept `kovanex status` (and every
        # request) from an answer; in a thread the loop serves meanwhile (issue 22 part 7)
        refs = await asyncio.to_thread(self.repos.ledger(repo).store.refs, TASK_PREFIX)
        moved = []
        for ref, tip in sorted(refs.items()):
            task_id = task_id_of(ref)
            if task_id is not None and self.tips.get((repo, task_id)) != tip:
                moved.append(task_id)
        await self.reconcile_tasks(repo, moved)

    async def _reconcile_from_tips(self, repo: str) -> None:
        """Every task of a repo (start, takeover), from one for-each-ref of the tips: a
        finished task with no run here needs nothing but its tip, so its history is not
        walked (a start costs what the live tasks cost, and memory stays flat)."""
        # in a child process when the repo is big: the parse's churn stays out of the
        # agent's heap, which only receives what it keeps (issue 11, ADR 0043)
        async for task_id, view in tipscan.scan(self.repos.path(repo)):
            if view is not None and (repo, task_id) not in self.runs.runs:
                self._observe(repo, view)
            else:
                await self.reconcile_task(repo, task_id)

    async def sweep_repo(self, repo: str, listing: bool = True) -> None:
        """Anti-entropy at the cost of the tasks in flight: every task ref is listed only
        when the repo's refs changed since the last full listing; otherwise only the
        active tasks' tips are read (one ref each), so idle cost does not grow with the
        number of finished tasks. `listing=False` (upkeep is moving the repo's refs by
        the thousand): the tasks in flight only; the listing waits for the next sweep."""
        stamp = self.repos.ref_stamp(repo)
        if listing and (stamp is None or stamp != self._stamps.get(repo)):
            await self.reconcile_repo(repo)
            if stamp is not None:
                self._stamps[repo] = stamp
            return
        ledger = self.repos.ledger(repo)
        for key in sorted(k for k in self.active if k[0] == repo):
            tip = ledger.tip(key[1])
            if tip is None:
                self.forget(key)
            elif tip != self.tips.get(key):
                await self.reconcile_task(repo, key[1])

    def forget(self, key: Key) -> None:
        """A task ref is gone (archived or deleted): drop what we kept about it."""
        self.active.discard(key)
        self.tips.pop(key, None)
        self.core.pending.pop(key, None)
        self.repos.ledger(key[0]).forget(key[1])

    async def reconcile_tasks(self, repo: str, task_ids: list[str]) -> None:
        """Reconcile tasks whose refs moved together (a push of many branches): first
        queue every plain submission among them in one ref transaction (issue 22: one per
        pass, not one CAS per task), then reconcile each as before; a task the batch
        did not take (busy, skipped, an invalid spec, a refused batch) takes the usual
        path, which re-reads it and decides again."""
        if len(task_ids) > 1:
            self._queue_together(repo, task_ids)
        for task_id in task_ids:
            await self.reconcile_task(repo, task_id)

    def _queue_together(self, repo: str, task_ids: list[str]) -> None:
        """Write `queued` for the submitted tasks among `task_ids` in one transaction.
        Synchronous on the loop, so no other coroutine runs in between: a task whose lock
        is free stays free until the batch is written, and a locked one is left out."""
        ledger = self.repos.ledger(repo)
        chains: list[Chain] = []
        for task_id in task_ids:
            if self.locks.of((repo, task_id)).locked():
                continue
            try:
                view = ledger.read(task_id)
            except NoSuchTask:
                continue
            if view.state != taskcore.SUBMITTED:
                continue
            opts = self.push_opts.get((repo, task_id, view.tip))
            if opts is not None and opts.skip:
                continue
            tr = queued_transition(
                ledger,
                view,
                opts.priority if opts is not None else None,
                self.ctx.cfg.limits,
                opts.pusher if opts is not None else None,
            )
            if tr is not None:
                chains.append(Chain(task_id, [tr], view.tip, tr.epoch))
        if len(chains) < 2:
            return  # one task: the usual path costs the same
        try:
            tips = ledger.append_batch(chains)
        except (CasConflict, StaleEpoch) as e:
            log.info(
                "%s: queueing %d tasks together refused (%s); one by one", repo, len(chains), e
            )
            return
        for c in chains:
            self.push_opts.pop((repo, c.task_id, c.expected_tip), None)
            self.tips[(repo, c.task_id)] = tips[c.task_id]

    async def reconcile_task(self, repo: str, task_id: str) -> None:
        async with self.locks.of((repo, task_id)):
            await self._reconcile(repo, task_id)

    def after_write(self, repo: str, task_id: str) -> None:
        """Another service wrote a transition (under the task's lock): take it in."""
        view = self.repos.ledger(repo).read(task_id)
        self._observe(repo, view)

    def _observe(
        self, repo: str, view: taskcore.TaskView, skipped: bool = False
    ) -> list[scheduler.Effect]:
        key = (repo, view.task_id)
        self.tips[key] = view.tip
        if view.state in taskcore.TERMINAL:
            self.active.discard(key)
        else:
            self.active.add(key)
        if view.state not in scheduler.HELD and view.state != taskcore.SUBMITTED:
            self.lease_over(repo, view)  # final or queued again: retract its assignment
        self.watch_lease(key, view)
        effects = self.core.observe(
            repo,
            view,
            run_epoch=self.runs.epoch_of(key),
            priority=lambda: self.priority(key),
            skipped=skipped,
        )
        for e in effects:
            if isinstance(e, StandDown):
                self.runs.stand_down(key, e.reason)
        return [e for e in effects if not isinstance(e, StandDown)]

    async def _reconcile(self, repo: str, task_id: str) -> None:
        ledger = self.repos.ledger(repo)
        for _ in range(3):  # each round follows one write; a branch needs at most two
            view = ledger.read(task_id)
            opts = None
            skipped = False
            if view.state == taskcore.SUBMITTED:
                opts = self.push_opts.pop((repo, task_id, view.tip), None)
                if opts is not None and opts.skip:
                    record_push(ledger, [RefUpdate("", view.tip, task_ref(task_id))], opts)
                skipped = is_skipped(ledger, task_id, view.tip)
            effects = self._observe(repo, view, skipped)
            if effects == [QueueSubmission(repo, task_id)] and self._place_at_once(
                repo, view, opts
            ):
                continue  # queued, placed and running: read the branch again
            if not effects or not self._execute(repo, effects, opts):
                return

    def _place_at_once(self, repo: str, view: taskcore.TaskView, opts: PushOptions | None) -> bool:
        """Queue, place and start a fresh submission in one chain (ADR 0108) when it finds
        a slot here, its grant and no task waiting before it; False when it does not, or
        when the chain was refused (the caller then queues it alone, as before). It runs
        under the task's lock with no await, so no other decision comes in between; a
        SERVER's placement (storage role) asks over the network: that takes the queue."""
        if self.ctx.cfg.role == "storage" or self.runs.slots.free == 0:
            return False
        ledger = self.repos.ledger(repo)
        prio = opts.priority if opts is not None else None
        who = opts.pusher if opts is not None else None
        queued = queued_transition(ledger, view, prio, self.ctx.cfg.limits, who)
        if queued is None:
            return False  # skipped, or an invalid spec: queue_submission says why
        try:
            spec = specmod.load_spec(
                ledger.spec_bytes(view.task_id) or b"", specmod.SPEC_PATH, self.ctx.cfg.limits
            )
        except specmod.SpecError:
            return False  # the usual path queues it and says why it cannot run
        grant = self.grant(spec, repo)
        if grant is None:
            return False
        t0 = self.ctx.clock.monotonic()
        rr = self.placer.rr
        decision = self.placer.decide(repo, view.task_id, spec)
        if grant and decision.node:
            decision = replace(decision, extra={**decision.extra, **grant})
        effects = self.core.place_fresh(repo, view, queued, decision, slot_free=True)
        if not effects or not self.runs.slots.try_acquire():
            self.placer.rr = rr  # a decision not acted on leaves the round-robin as it was
            return False
        if not self._execute(repo, effects, request=spec.request(repo, view.task_id)):
            self.runs.slots.release()  # refused whole (moved, stale epoch or term): the
            return False  # caller's `queued` alone re-reads the branch and decides again
        self.on_placed(self.ctx.clock.monotonic() - t0)
        return True

    # -- placement ---------------------------------------------------------------------
    async def schedule_pending(self) -> None:
        """Place queued tasks, highest priority first; capacity waits keep them queued."""
        for key in self.core.order():
            if self.runs.slots.free == 0 and not self.can_place_remotely():
                return  # nothing can start until a slot frees; that kicks us again
            await self.schedule(key)

    async def schedule(self, key: Key) -> None:
        repo, task_id = key
        t0 = self.ctx.clock.monotonic()
        asked = await self.server_placement.ask(key)  # a SERVER decides; no lock held
        async with self.locks.of(key):
            ledger = self.repos.ledger(repo)
            try:
                view = ledger.read(task_id)
            except NoSuchTask:  # its branch moved to lost/ (we were deposed): not ours
                self.core.pending.pop(key, None)
                return
            if view.state not in scheduler.WAITING:
                self.core.pending.pop(key, None)
                return
            if asked is not None and asked[0] != view.tip:
                return  # it moved while the server decided; that move kicks another pass
            try:
                spec = specmod.load_spec(
                    ledger.spec_bytes(task_id) or b"", specmod.SPEC_PATH, self.ctx.cfg.limits
                )
            except specmod.SpecError as e:
                bad = scheduler.Decision(reason=f"invalid spec: {e}")
                self._execute(repo, self.core.decide(repo, view, bad, slot_free=False))
                self.core.pending.pop(key, None)  # only a new push can change that
                return
            grant = self.grant(spec, repo)
            if grant is None:
                return  # absolute_consistency without a quorum: it waits queued (issue 12)
            decision = asked[1] if asked else self.placer.decide(repo, task_id, spec)
            if grant and decision.node:  # the grant carries the leader term
                decision = replace(decision, extra={**decision.extra, **grant})
            effects = self.core.decide(repo, view, decision, slot_free=self.runs.slots.free > 0)
            if not effects:
                return
            starts = any(isinstance(e, StartRun) for e in effects)
            if starts and not self.runs.slots.try_acquire():
                self._observe(repo, view)  # back in the queue; a slot release kicks us
                return
            if not self._execute(repo, effects, request=spec.request(repo, task_id)):
                if starts:
                    self.runs.slots.release()
                return
            if any(
                isinstance(e, WriteRef) and e.transition.state == taskcore.PLACED for e in effects
            ):
                self.on_placed(self.ctx.clock.monotonic() - t0)
            self._observe(repo, ledger.read(task_id))

    # -- effects -----------------------------------------------------------------------
    def _execute(
        self,
        repo: str,
        effects: list[scheduler.Effect],
        opts: PushOptions | None = None,
        request: Any = None,
    ) -> bool:
        """Carry out effects in order; False at the first refused write (nothing after it
        runs: a placement whose write lost must not start)."""
        ledger = self.repos.ledger(repo)
        for e in effects:
            key = (repo, e.task_id)
            if isinstance(e, WriteRef):
                try:
                    tip = ledger.append_all(
                        e.task_id,
                        [e.transition, *e.then],
                        expected_tip=e.expected_tip,
                        lease_epoch=e.transition.epoch,
                    )
                except StaleTerm as err:
                    # our term was behind the branch's (a heal, before our view of the lease
                    # caught up): the tip did not move, so nothing else would queue it again
                    log.info("%s/%s: %s; placing it again at the next pass", *key, err)
                    self._observe(repo, ledger.read(e.task_id))
                    return False
                except (CasConflict, StaleEpoch):
                    self.kick(repo)  # someone else moved it: re-read on the next pass
                    return False
                self.tips[key] = tip
                if e.transition.state == taskcore.QUEUED and e.transition.reason:
                    log.info("%s/%s requeued: %s", repo, e.task_id, e.transition.reason)
            elif isinstance(e, QueueSubmission):
                prio = opts.priority if opts is not None else None
                who = opts.pusher if opts is not None else None
                queue_submission(ledger, e.task_id, prio, self.ctx.cfg.limits, who)
            elif isinstance(e, KillOrphan):
                pidfile = self.ctx.layout.run / "steps" / f"{repo}__{e.task_id}.json"
                if kill_orphan(pidfile):
                    log.info("%s/%s: killed an orphaned step from before the restart", *key)
            elif isinstance(e, StartRun):
                lease = Lease(e.task_id, self.ctx.name, e.epoch, repo=repo)
                self.runs.start(lease, ledger, self.repos.path(repo), request=request)
            elif isinstance(e, Assign):
                self.announce(e)
            elif isinstance(e, StandDown):
                self.runs.stand_down(key, e.reason)
        return True
