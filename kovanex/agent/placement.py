"""Build the scheduler's view (this node + gossip members) and place one task.

The scoring is the pure core (kovanex/core/scoring.py); this shell only gathers
inputs and turns the answer into the placement commit's trailers.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import psutil

from kovanex import modules as nodemodules
from kovanex import spec as specmod
from kovanex.agent.context import NodeContext
from kovanex.agent.repos import RepoIndex
from kovanex.agent.runs import RunTable
from kovanex.core import scoring, startwatch
from kovanex.core.scheduler import Decision
from kovanex.gitstate.ledger import TaskLedger, transition_of

DEFAULT_CPU = 0.1  # a task that names no cpu asks for a tenth of a core (Nomad-like)
DEFAULT_MEM_MB = 64


def request_of(repo: str, task_id: str, spec: specmod.TaskSpec) -> scoring.TaskRequest:
    p = spec.placement
    return scoring.TaskRequest(
        task_id=task_id,
        repo=repo,
        labels=dict(p.labels),
        requires=frozenset(p.requires),
        cpu=p.cpu if p.cpu is not None else DEFAULT_CPU,
        memory_mb=p.memory_mb if p.memory_mb is not None else DEFAULT_MEM_MB,
        priority=spec.priority,
    )


class Placer:
    """Scores a task over the nodes this node knows: itself and its gossip members.

    Its inputs are functions, so a test gives it a list of `NodeInfo`s and nothing else.
    """

    def __init__(
        self,
        nodes: Callable[[], list[scoring.NodeInfo]],
        ledger: Callable[[str], TaskLedger],
        strategy: Callable[[], str],
    ) -> None:
        self.nodes = nodes
        self.ledger = ledger
        self.strategy = strategy
        self.rr = 0

    def excluded(self, repo: str, task_id: str) -> frozenset[str]:
        """Nodes that failed to start this task (Kovanex-Excluded, ADR 0012)."""
        led = self.ledger(repo)
        tip = led.tip(task_id)
        if tip is None:
            return frozenset()
        return startwatch.excluded(transition_of(c.message) for c in led.store.walk(tip))

    def decide(self, repo: str, task_id: str, spec: specmod.TaskSpec) -> Decision:
        req = request_of(repo, task_id, spec)
        strategy = spec.placement.strategy or self.strategy()
        return self.decide_request(req, strategy, self.excluded(repo, task_id))

    def decide_request(
        self, req: scoring.TaskRequest, strategy: str, excl: frozenset[str]
    ) -> Decision:
        """Score `req` over this node's view; a SERVER answers peers' requests with it."""
        d = self._decide(req, strategy, startwatch.candidates(self.nodes(), excl))
        if d.node is None and excl:
            anyone = self._decide(req, strategy, self.nodes())
            if anyone.node is not None or anyone.waiting:
                return Decision(reason=startwatch.all_excluded_reason(excl, d.reason))
        return d

    def _decide(
        self, req: scoring.TaskRequest, strategy: str, nodes: list[scoring.NodeInfo]
    ) -> Decision:
        result = scoring.place(
            scoring.NodeTable.from_nodes(nodes), req, strategy=strategy, rr_counter=self.rr
        )
        if isinstance(result, scoring.Unschedulable):
            idle = [replace(n, cpu_used=0.0, mem_used_mb=0.0, runners_used=0) for n in nodes]
            again = scoring.place(scoring.NodeTable.from_nodes(idle), req, strategy=strategy)
            if isinstance(again, scoring.Placement):
                return Decision(reason=f"waiting for capacity: {result.reason}", waiting=True)
            return Decision(reason=result.reason)
        self.rr += 1
        extra = {
            "Score": f"{result.score:.3f}",
            "Score-Breakdown": " ".join(f"{k}={v:.2f}" for k, v in result.breakdown.items()),
            "Strategy": result.strategy,
            "Feasible": str(result.feasible),
        }
        if result.runners_up:
            # Nomad-style allocation metrics: why each runner-up lost, factor by factor
            extra["Runners-Up"] = ", ".join(
                f"{n}={s:.3f} (" + " ".join(f"{k}={v:.2f}" for k, v in bd.items()) + ")"
                for n, s, bd in result.runners_up
            )
        return Decision(node=result.node, reason=result.reason, extra=extra)

    def preview(self, repo: str, task_id: str, spec: specmod.TaskSpec) -> str:
        d = self.decide(repo, task_id, spec)
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
