"""Pushes as the hooks hand them over: pre-receive checks (and sync replication, the
last word before a push is accepted), post-receive notes what to queue."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from kovanex.agent.context import NodeContext
from kovanex.agent.dispatch import Dispatcher
from kovanex.agent.hookserver import HookRequest
from kovanex.agent.placement import Placer
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


class PushHandler:
    def __init__(
        self,
        ctx: NodeContext,
        repos: RepoIndex,
        placer: Placer,
        scheduler: TaskScheduler,
        dispatcher: Dispatcher,
        replicas: Any,
        owner_desc: Callable[[str], str],
        watch: Callable[[str], None],
    ) -> None:
        self.ctx = ctx
        self.repos = repos
        self.placer = placer
        self.scheduler = scheduler
        self.dispatcher = dispatcher
        self.replicas = replicas
        self.owner_desc = owner_desc
        self.watch = watch
        # set by the daemon: a pushed release tag or promote/<version> ref starts a
        # promotion, whose report streams back through `emit` (kovanex/agent/promotions.py)
        self.on_release: Callable[..., Awaitable[list[str]]] | None = None
        # set by the daemon: may this node place consistent work now (quorum, synced)?
        self.quorum: Callable[[], bool] | None = None

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
        verdict = check_pre_receive(
            req.git_dir,
            req.quarantine or None,
            updates,
            options,
            node=self.ctx.name,
            preview=lambda tid, spec: self.placer.preview(repo, tid, spec),
            owner_url=lambda: None if owner else self.owner_desc(repo),
            limits=self.ctx.cfg.limits,
            coordination=self.ctx.cfg.coordination,
            quorum=self.quorum,
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
            self.dispatcher.changed(repo, tid)
            what = "skipped (push option skip)" if options.skip else "accepted"
            msgs.append(
                f"kovanex: task {tid} {what} by {self.ctx.name}; "
                f"follow it: kovanex task logs {tid} --follow"
            )
        return msgs
