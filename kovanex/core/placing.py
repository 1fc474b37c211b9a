"""One task's placement over the nodes a scheduler knows, pure: score, or say why not.

Shared by the agent's `Placer`, a SERVER answering a peer (ADR 0014) and the simulator,
so all three place by the same rules: hard filters and the score (`scoring.place`), wait
(without a commit) when only capacity is short, and explain when the only nodes that
could run the task are the ones the placement deadline excluded (ADR 0012) or cordoned
ones (ADR 0055).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from kovanex.core import scoring, startwatch
from kovanex.core.scheduler import Decision
from kovanex.core.strategies import reason_cordoned


def decide(
    nodes: Sequence[scoring.NodeInfo],
    req: scoring.TaskRequest,
    strategy: str,
    excluded: frozenset[str] = frozenset(),
    rr: int = 0,
) -> Decision:
    """`rr` is the caller's round-robin counter (the `round-robin` strategy); it should
    advance by one each time a decision names a node. A cordoned node (`NodeInfo.cordoned`)
    is never chosen; when only cordoned nodes could take the task, the reason says so."""
    open_nodes = [n for n in nodes if not n.cordoned]
    d = _decide(req, strategy, startwatch.candidates(open_nodes, excluded), rr)
    if d.node is None and not d.waiting and len(open_nodes) < len(nodes):
        fit = [
            n.name
            for n in nodes
            if n.cordoned and n.name not in excluded and _fits(req, strategy, n)
        ]
        if fit:
            return Decision(reason=reason_cordoned(fit))
    nodes = open_nodes
    if d.node is None and excluded:
        anyone = _decide(req, strategy, list(nodes), rr)
        if anyone.node is not None or anyone.waiting:
            return Decision(reason=startwatch.all_excluded_reason(excluded, d.reason))
    return d


def held_back(
    nodes: Sequence[scoring.NodeInfo],
    req: scoring.TaskRequest,
    strategy: str,
    excluded: frozenset[str],
) -> frozenset[str]:
    """The excluded nodes that would take the task right now (open, matching, a runner
    free): only the task's exclusions keep it from them (startwatch.lapse lets them back)."""
    return frozenset(
        n.name
        for n in nodes
        if n.name in excluded and not n.cordoned and _decide(req, strategy, [n], 0).node
    )


def _fits(req: scoring.TaskRequest, strategy: str, node: scoring.NodeInfo) -> bool:
    """Would this one node take the task, now or once its capacity frees?"""
    d = _decide(req, strategy, [node], 0)
    return d.node is not None or d.waiting


def _decide(
    req: scoring.TaskRequest, strategy: str, nodes: list[scoring.NodeInfo], rr: int
) -> Decision:
    result = scoring.place(
        scoring.NodeTable.from_nodes(nodes), req, strategy=strategy, rr_counter=rr
    )
    if isinstance(result, scoring.Unschedulable):
        idle = [replace(n, cpu_used=0.0, mem_used_mb=0.0, runners_used=0) for n in nodes]
        again = scoring.place(scoring.NodeTable.from_nodes(idle), req, strategy=strategy)
        if isinstance(again, scoring.Placement):
            return Decision(reason=f"waiting for capacity: {result.reason}", waiting=True)
        return Decision(reason=result.reason)
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
