"""Pushes as the hooks hand them over: pre-receive checks (and sync replication, the
last word before a push is accepted), post-receive notes what to queue."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import ParamSpec, TypeVar

from kovanex.agent.context import NodeContext
from kovanex.agent.dispatch import Dispatcher
from kovanex.agent.hookserver import HookRequest
from kovanex.agent.placement import Placer
from kovanex.agent.replication.manager import ReplicaManager
from kovanex.agent.repos import RepoIndex
from kovanex.agent.scheduling import TaskScheduler
from kovanex.gitstate.ledger import task_id_of
from kovanex.pushcheck import (
    ZERO,
    PushOptions,
    RefUpdate,
    broken_refusal,
    check_pre_receive,
    keep_pusher_log,
)

CHECK_THREADS = 2
P = ParamSpec("P")
R = TypeVar("R")


def on_loop(loop: asyncio.AbstractEventLoop, fn: Callable[P, R]) -> Callable[P, R]:
    """`fn`, callable from a worker thread, run on `loop` (which owns the state it reads)."""

    def call(*args: P.args, **kw: P.kwargs) -> R:
        async def run() -> R:
            return fn(*args, **kw)

        return asyncio.run_coroutine_threadsafe(run(), loop).result()

    return call


class PushHandler:
    def __init__(
        self,
        ctx: NodeContext,
        repos: RepoIndex,
        placer: Placer,
        scheduler: TaskScheduler,
        dispatcher: Dispatcher,
        replicas: ReplicaManager,
        owner_desc: Callable[[str], str],
        watch: Callable[[str], None],
        *,
        on_release: Callable[..., Awaitable[list[str]]] | None = None,
        quorum: Callable[[], bool] | None = None,
    ) -> None:
        self.ctx = ctx
        self.repos = repos
        self.placer = placer
        self.scheduler = scheduler
        self.dispatcher = dispatcher
        self.replicas = replicas
        self.owner_desc = owner_desc
        self.watch = watch
        # a pushed release tag or promote/<version> ref starts a promotion, whose report
        # streams back through `emit` (kovanex/agent/promotions.py)
        self.on_release = on_release
        # may this node place consistent work now (quorum, synced)? None: not asked
        self.quorum = quorum
        # pre-receive checks run here, off the loop; few threads, so ten pushes at once
        # queue behind each other instead of all contending with the loop for the GIL
        self._checks = ThreadPoolExecutor(CHECK_THREADS, thread_name_prefix="push-check")

    async def on_hook(self, req: HookRequest) -> tuple[bool, list[str]]:
        updates = [RefUpdate.parse(r) for r in req.refs]
        options = PushOptions.parse(req.options)
        options.pusher = req.pusher
        options.from_node = req.via == "node"
        repo = Path(req.git_dir).name.removesuffix(".git")
        if req.phase == "pre-receive":
            return await self._pre_receive(req, repo, updates, options)
        if req.phase == "post-receive":
            msgs = self._post_receive(repo, updates, options)
            if self.on_release is not None:
                msgs += await self.on_release(repo, updates, req.emit)
            return True, msgs
        return False, [f"kovanex: unknown hook phase {req.phase!r}"]

    async def _pre_receive(
        self, req: HookRequest, repo: str, updates: list[RefUpdate], options: PushOptions
    ) -> tuple[bool, list[str]]:
        if repo in self.repos.broken and not options.from_node:
            return False, [broken_refusal(repo, self.repos.broken[repo], self.ctx.name)]
        owner = self.replicas.is_owner(repo)
        owner_desc = None if owner else self.owner_desc(repo)
        loop = asyncio.get_running_loop()
        quorum = self.quorum
        # Off the event loop: the check lists the push's objects, reads and parses its
        # specs and commits, all of which grow with the input (issue 24); what it asks of
        # the agent's own state (a placement preview, the quorum) is asked on the loop.
        verdict = await loop.run_in_executor(
            self._checks,
            functools.partial(
                check_pre_receive,
                req.git_dir,
                req.quarantine or None,
                updates,
                options,
                node=self.ctx.name,
                preview=on_loop(loop, lambda tid, spec: self.placer.preview(repo, tid, spec)),
                owner_url=lambda: owner_desc,
                limits=self.ctx.cfg.limits,
                coordination=self.ctx.cfg.coordination,
                quorum=None if quorum is None else on_loop(loop, quorum),
                fold=True,
            ),
        )
        if verdict.ok and owner:
            # last check: a commit the replicas acked but we then refused could be
            # promoted by a takeover, so nothing may refuse the push after this
            ok, why = await self.replicas.replicate_sync(
                repo, [(u.old, u.new, u.ref) for u in updates], req.quarantine or None
            )
            if not ok:
                verdict.reject(f"kovanex: {why}")
        if verdict.ok:
            keep_pusher_log(req.git_dir, updates)
            led = self.repos.ledger(repo)
            for tid, view in verdict.views.items():
                led.prime(tid, view)  # folded in the worker: the loop never walks the push
            for u in updates:
                tid = task_id_of(u.ref)
                if tid is not None and u.new != ZERO:
                    self.scheduler.push_opts[(repo, tid, u.new)] = options
        return verdict.ok, verdict.messages

    def _post_receive(self, repo: str, updates: list[RefUpdate], options: PushOptions) -> list[str]:
        """Answer at once (the pusher is waiting); queueing and placement follow on the
        event loop. Push options were recorded at pre-receive."""
        if repo not in self.repos.all():
            self.repos.refresh()
        self.watch(repo)
        msgs = []
        for u in updates:
            tid = task_id_of(u.ref)
            if tid is None or u.new == ZERO:
                continue
            self.scheduler.push_opts.setdefault((repo, tid, u.new), options)
            self.dispatcher.pushed(repo, tid)
            what = "skipped (push option skip)" if options.skip else "accepted"
            msgs.append(
                f"kovanex: task {tid} {what} by {self.ctx.name}; "
                f"follow it: kovanex task logs {tid} --follow"
            )
        return msgs
