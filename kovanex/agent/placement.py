"""Build the scheduler's view (this node + gossip members) and place one task.

The scoring is the pure core (kovanex/core/scoring.py); this shell only gathers
inputs and turns the answer into the placement commit's trailers.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace

import psutil

from kovanex import nodemodules
from kovanex import spec as specmod
from kovanex.agent.context import NodeContext
from kovanex.agent.repos import RepoIndex
from kovanex.agent.runs import RunTable
from kovanex.clock import SYSTEM, Clock
from kovanex.core import placing, scoring, startwatch
from kovanex.core.scheduler import Decision
from kovanex.gitstate.ledger import TaskLedger, exclusions

log = logging.getLogger("kovanex.agent")


class Placer:
    """Scores a task over the nodes this node knows: itself and its gossip members.

    Its inputs are functions, so a test gives it a list of `NodeInfo`s and nothing else.
    """

    def __init__(
        self,
        nodes: Callable[[], list[scoring.NodeInfo]],
        ledger: Callable[[str], TaskLedger],
        strategy: Callable[[], str],
        *,
        clock: Clock = SYSTEM,
        lapse_base: Callable[[], float] = lambda: 10.0,
    ) -> None:
        self.nodes = nodes
        self.ledger = ledger
        self.strategy = strategy
        self.rr = 0
        self.clock = clock
        # the placement deadline: exclusions that alone keep a task from an idle matching
        # node lapse after it, doubled per lapse (core/startwatch.lapse, issue 25 bug 9)
        self.lapse_base = lapse_base
        self.lapses: dict[tuple[str, str], startwatch.Lapse] = {}

    def excluded(self, repo: str, task_id: str) -> frozenset[str]:
        """Nodes that failed to start this task (Kovanex-Excluded, ADR 0012)."""
        return exclusions(self.ledger(repo), task_id)

    def decide(self, repo: str, task_id: str, spec: specmod.TaskSpec) -> Decision:
        """Place by the rules; when only the task's exclusions keep it from an idle
        matching node, they lapse after a backoff and the placement lets that node back in
        (its `Kovanex-Excluded-Cleared` trailer says so)."""
        req = spec.request(repo, task_id)
        strategy = spec.placement.strategy or self.strategy()
        excl = self.excluded(repo, task_id)
        d = self.decide_request(req, strategy, excl)
        if d.node is not None or not excl:
            return d
        key = (repo, task_id)
        back = placing.held_back(self.nodes(), req, strategy, excl)
        now = self.clock.monotonic()
        mem, let = startwatch.lapse(self.lapses.get(key), back, now, self.lapse_base())
        if mem is None:
            self.lapses.pop(key, None)
        else:
            self.lapses[key] = mem
        if not let:
            return d
        again = self.decide_request(req, strategy, excl - let)
        if again.node is None:
            return d
        log.info("%s/%s: the exclusion of %s lapsed: placed again on %s", repo, task_id,
                 ",".join(sorted(let)), again.node)  # fmt: skip
        return replace(again, extra=startwatch.lapsed_extra(again.extra, let, excl))

    def forget(self, key: tuple[str, str]) -> None:
        """The task is archived: its lapse memory goes with it."""
        self.lapses.pop(key, None)

    def decide_request(
        self, req: scoring.TaskRequest, strategy: str, excl: frozenset[str]
    ) -> Decision:
        """Score `req` over this node's view; a SERVER answers peers' requests with it."""
        d = placing.decide(self.nodes(), req, strategy, excl, self.rr)
        if d.node is not None:
            self.rr += 1
        return d

    def preview(self, repo: str, task_id: str, spec: specmod.TaskSpec) -> str:
        """What a placement would say now (no lapse is spent on a preview)."""
        req = spec.request(repo, task_id)
        strategy = spec.placement.strategy or self.strategy()
        d = self.decide_request(req, strategy, self.excluded(repo, task_id))
        if d.node:
            return f"would place on {d.node}: {d.reason}"
        return ("would wait: " if d.waiting else "unschedulable: ") + d.reason


class LocalNode:
    """This node as the scheduler sees it: its config, its free slots and what its runs
    asked for, its health, and the repos it holds."""

    def __init__(
        self,
        ctx: NodeContext,
        runs: RunTable,
        repos: RepoIndex,
        health: Callable[[], float],
    ) -> None:
        self.ctx = ctx
        self.runs = runs
        self.repos = repos
        self.health = health
        self.cpu_total = float(psutil.cpu_count() or 1)
        self.mem_total = psutil.virtual_memory().total / 2**20

    def capabilities(self) -> set[str]:
        return nodemodules.capabilities(self.ctx.cfg)

    def info(self) -> scoring.NodeInfo:
        cfg = self.ctx.cfg
        cpu_used, mem_used = self.runs.used()
        return scoring.NodeInfo(
            name=cfg.name,
            role=cfg.role.upper(),
            labels=dict(cfg.labels),
            capabilities=frozenset(self.capabilities()),
            health=self.health(),
            cpu_total=self.cpu_total,
            cpu_used=cpu_used,
            mem_total_mb=self.mem_total,
            mem_used_mb=mem_used,
            runners_total=self.runs.slots.total,
            runners_used=self.runs.slots.used,
            repos_owned=frozenset(self.repos.owned()),
            repos_replica=frozenset(self.repos.replicas()),
        )
