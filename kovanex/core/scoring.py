"""Placement core: score = health x capacity x locality x label_match, vectorised over nodes.

Hard constraints are filters applied first, in a fixed order, so a zero score always
means "infeasible" and an unschedulable task is explained by the filter that removed
the last candidates. `place` (numpy) and `place_plain` (pure Python, the benchmark
baseline) return the same placements; tests assert it. The value types (NodeInfo,
TaskRequest, Placement, Unschedulable) live in `strategies` and are re-exported here.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace

import numpy as np

from kovanex.core.strategies import (
    EPS,
    FACTORS,
    HEALTH_FLOOR,
    LN10,
    PREFER_PENALTY,
    QUANTUM,
    REASON_ALIVE,
    REASON_EMPTY,
    REASON_HEALTH,
    REASON_ROLE,
    REASON_SLOT,
    ROLES_RUNNING_TASKS,
    Breakdown,
    NodeInfo,
    Placement,
    Strategy,
    TaskRequest,
    Unschedulable,
    binpack_scalar,
    binpack_vec,
    chosen_reason,
    label_match_scalar,
    locality_capacity_scalar,
    locality_capacity_vec,
    locality_value,
    locality_vec,
    quantise,
    reason_cap,
    reason_cpu,
    reason_labels,
    reason_mem,
    spread_scalar,
    spread_vec,
)

__all__ = [
    "FACTORS",
    "NodeInfo",
    "NodeTable",
    "Placement",
    "Strategy",
    "TaskRequest",
    "Unschedulable",
    "apply_plain",
    "fragmentation",
    "place",
    "place_plain",
]

# --- the struct-of-arrays table -----------------------------------------------------------


class NodeTable:
    """All nodes as parallel numpy arrays, sorted by name (index order = tie-break order).

    Free capacity is kept as arrays updated per `apply`/`release` (one node at a time),
    so a placement only pays for the per-task arithmetic over all nodes.
    """

    def __init__(self, nodes: Iterable[NodeInfo]) -> None:
        ordered = sorted(nodes, key=lambda n: n.name)
        self.names: list[str] = [n.name for n in ordered]
        if len(set(self.names)) != len(self.names):
            raise ValueError("duplicate node names")
        self.index: dict[str, int] = {name: i for i, name in enumerate(self.names)}
        f64 = np.float64
        self.health = np.clip(np.array([n.health for n in ordered], dtype=f64), 0.0, 1.0)
        self.cpu_total = np.array([n.cpu_total for n in ordered], dtype=f64)
        self.cpu_used = np.array([n.cpu_used for n in ordered], dtype=f64)
        self.mem_total = np.array([n.mem_total_mb for n in ordered], dtype=f64)
        self.mem_used = np.array([n.mem_used_mb for n in ordered], dtype=f64)
        self.runners_total = np.array([n.runners_total for n in ordered], dtype=np.int64)
        self.runners_used = np.array([n.runners_used for n in ordered], dtype=np.int64)
        self.alive = np.array([n.alive for n in ordered], dtype=bool)
        self.roles: list[str] = [n.role for n in ordered]
        self.runnable = np.array([n.role in ROLES_RUNNING_TASKS for n in ordered], dtype=bool)
        self.labels: list[dict[str, str]] = [dict(n.labels) for n in ordered]
        self.capabilities: list[frozenset[str]] = [frozenset(n.capabilities) for n in ordered]
        self.repos_owned: list[frozenset[str]] = [frozenset(n.repos_owned) for n in ordered]
        self.repos_replica: list[frozenset[str]] = [frozenset(n.repos_replica) for n in ordered]
        # Reciprocals once, so a placement multiplies instead of dividing (0 for a 0 total).
        self.inv_cpu = _inv(self.cpu_total)
        self.inv_mem = _inv(self.mem_total)
        self.inv_cpu_ln = self.inv_cpu * LN10
        self.inv_mem_ln = self.inv_mem * LN10
        self.inv_run = _inv(self.runners_total.astype(f64))
        self.cpu_free = self.cpu_total - self.cpu_used
        self.mem_free = self.mem_total - self.mem_used
        self.has_slot = self.runners_used < self.runners_total
        self.fr_after = ((self.runners_total - self.runners_used) - 1) * self.inv_run
        n = len(ordered)
        self._cap: dict[str, np.ndarray] = {}
        self._label: dict[tuple[str, str], np.ndarray] = {}
        owners: dict[str, list[int]] = {}
        replicas: dict[str, list[int]] = {}
        for i, node in enumerate(ordered):
            for c in node.capabilities:
                self._cap.setdefault(c, np.zeros(n, dtype=bool))[i] = True
            for kv in node.labels.items():
                self._label.setdefault(kv, np.zeros(n, dtype=bool))[i] = True
            for r in node.repos_owned:
                owners.setdefault(r, []).append(i)
            for r in node.repos_replica:
                replicas.setdefault(r, []).append(i)
        self._owners = {r: np.array(v, dtype=np.int64) for r, v in owners.items()}
        self._replicas = {r: np.array(v, dtype=np.int64) for r, v in replicas.items()}
        self._static: dict[tuple, tuple[np.ndarray | None, Unschedulable | None]] = {}
        self._hl: dict[Strategy, np.ndarray] = {}
        self.health_floor_ok = bool(n == 0 or self.health.min() >= HEALTH_FLOOR)

    @classmethod
    def from_nodes(cls, nodes: Iterable[NodeInfo]) -> NodeTable:
        return cls(nodes)

    def __len__(self) -> int:
        return len(self.names)

    def _i(self, node: str | int) -> int:
        return node if isinstance(node, int) else self.index[node]

    def _refresh(self, i: int) -> None:
        self.cpu_free[i] = self.cpu_total[i] - self.cpu_used[i]
        self.mem_free[i] = self.mem_total[i] - self.mem_used[i]
        self.has_slot[i] = self.runners_used[i] < self.runners_total[i]
        self.fr_after[i] = ((self.runners_total[i] - self.runners_used[i]) - 1) * self.inv_run[i]

    def apply(self, node: str | int, req: TaskRequest) -> None:
        """Account a placed task on `node` so the next placement sees the reduced capacity."""
        i = self._i(node)
        self.cpu_used[i] += req.cpu
        self.mem_used[i] += req.memory_mb
        self.runners_used[i] += 1
        self._refresh(i)

    def release(self, node: str | int, req: TaskRequest) -> None:
        i = self._i(node)
        self.cpu_used[i] -= req.cpu
        self.mem_used[i] -= req.memory_mb
        self.runners_used[i] -= 1
        self._refresh(i)

    def set_alive(self, node: str, alive: bool) -> None:
        self.alive[self.index[node]] = alive
        self._static.clear()

    def set_health(self, node: str, health: float) -> None:
        self.health[self.index[node]] = min(max(float(health), 0.0), 1.0)
        self._hl.clear()
        self.health_floor_ok = bool(self.health.min() >= HEALTH_FLOOR)

    def to_nodes(self) -> list[NodeInfo]:
        """The current state as NodeInfo values (for `place_plain` and for snapshots)."""
        return [
            NodeInfo(
                name=self.names[i],
                role=self.roles[i],
                labels=self.labels[i],
                capabilities=self.capabilities[i],
                health=float(self.health[i]),
                cpu_total=float(self.cpu_total[i]),
                cpu_used=float(self.cpu_used[i]),
                mem_total_mb=float(self.mem_total[i]),
                mem_used_mb=float(self.mem_used[i]),
                runners_total=int(self.runners_total[i]),
                runners_used=int(self.runners_used[i]),
                repos_owned=self.repos_owned[i],
                repos_replica=self.repos_replica[i],
                alive=bool(self.alive[i]),
            )
            for i in range(len(self))
        ]

    def static_mask(self, req: TaskRequest) -> tuple[np.ndarray | None, Unschedulable | None]:
        """Alive, role, capabilities, labels: cached per constraint class (as Nomad does)."""
        # Label order only affects cache hits, never the answer, so skip sorting here.
        req_caps = req.requires if isinstance(req.requires, frozenset) else frozenset(req.requires)
        key = (req_caps, tuple(req.labels.items()))
        hit = self._static.get(key)
        if hit is not None:
            return hit
        out = self._compute_static(req)
        self._static[key] = out
        return out

    def _compute_static(self, req: TaskRequest) -> tuple[np.ndarray | None, Unschedulable | None]:
        if len(self) == 0:
            return None, Unschedulable(REASON_EMPTY, "empty")
        m = self.alive.copy()
        if not m.any():
            return None, Unschedulable(REASON_ALIVE, "alive")
        m &= self.runnable
        if not m.any():
            return None, Unschedulable(REASON_ROLE, "role")
        base = m
        caps = sorted(req.requires)
        for cap in caps:
            m = m & self._cap.get(cap, False)
            if not m.any():
                missing = [c for c in caps if not (base & self._cap.get(c, False)).any()]
                return None, Unschedulable(reason_cap(missing or caps), "capability")
        base = m
        items = sorted(req.labels.items())
        for kv in items:
            m = m & self._label.get(kv, False)
            if not m.any():
                missing = [p for p in items if not (base & self._label.get(p, False)).any()]
                return None, Unschedulable(reason_labels(missing or items), "label")
        return m, None

    def locality(self, repo: str, strategy: Strategy) -> np.ndarray:
        return locality_vec(len(self), self._owners.get(repo), self._replicas.get(repo), strategy)

    def health_x_locality(self, repo: str, strategy: Strategy, cap: np.ndarray) -> np.ndarray:
        """(health * locality) * capacity, as a new array.

        Most nodes are remote for any given repo, so multiply everyone by the cached
        health * remote factor, then redo the few owner/replica nodes exactly.
        """
        base = self._hl.get(strategy)
        if base is None:
            base = self.health * locality_value(False, False, strategy)
            self._hl[strategy] = base
        out = base * cap
        for idx, val in (
            (self._replicas.get(repo), locality_value(False, True, strategy)),
            (self._owners.get(repo), locality_value(True, False, strategy)),
        ):
            if idx is not None:
                out[idx] = (self.health[idx] * val) * cap[idx]
        return out

    def label_match(self, prefer: Mapping[str, str]) -> np.ndarray | float:
        if not prefer:
            return 1.0
        hits = np.zeros(len(self), dtype=np.int64)
        for kv in prefer.items():
            mask = self._label.get(kv)
            if mask is not None:
                hits += mask
        return 1.0 - PREFER_PENALTY * ((len(prefer) - hits) / len(prefer))


def _inv(a: np.ndarray) -> np.ndarray:
    out = np.zeros_like(a, dtype=np.float64)
    np.divide(1.0, a, out=out, where=a > 0)
    return out


# --- numpy placement -----------------------------------------------------------------------


def place(
    table: NodeTable,
    request: TaskRequest,
    *,
    strategy: str | Strategy | None = None,
    rr_counter: int = 0,
) -> Placement | Unschedulable:
    """Filter, score every node, pick the best (ties: lower name). Does not mutate the table."""
    strat = Strategy(strategy or request.strategy)
    static, why = table.static_mask(request)
    if why is not None:
        return why
    cpu, mem = request.cpu, request.memory_mb
    m = table.cpu_free >= cpu - EPS
    m &= table.mem_free >= mem - EPS
    m &= table.has_slot
    m &= static
    if strat is Strategy.BEST_FIT:
        fc = np.subtract(table.cpu_free, cpu)
        fc *= table.inv_cpu_ln
        fm = np.subtract(table.mem_free, mem)
        fm *= table.inv_mem_ln
        cap = binpack_vec(fc, fm)
    else:
        fc = np.subtract(table.cpu_free, cpu)
        fc *= table.inv_cpu
        fm = np.subtract(table.mem_free, mem)
        fm *= table.inv_mem
        cap = spread_vec(fc, fm, table.fr_after)
        if strat is Strategy.LOCALITY:
            cap = locality_capacity_vec(cap)
    score = table.health_x_locality(request.repo, strat, cap)
    lab = table.label_match(request.prefer)
    if request.prefer:
        score *= lab
    score *= m
    ranked = _top4(score)
    if not ranked:
        return _why_not(table, request, static)
    # Every feasible node scores >= QUANTUM unless some health is ~0 (factor floors:
    # capacity 0.05, locality 0.027, label 0.5), so the bool mask usually is the answer.
    pos = m if table.health_floor_ok else score >= QUANTUM
    k = int(np.count_nonzero(pos))
    if strat is Strategy.ROUND_ROBIN:
        best = int(np.flatnonzero(pos)[rr_counter % k])
        ranked = [i for i in ranked if i != best][:3]
    else:
        best, ranked = ranked[0], ranked[1:]

    picks = [best, *ranked]
    health = table.health[picks].tolist()
    caps = cap[picks].tolist()
    scores = score[picks].tolist()
    labs = [lab] * len(picks) if isinstance(lab, float) else lab[picks].tolist()
    repo = request.repo
    rows = [
        (
            table.names[i],
            quantise(scores[j]),
            {
                "health": health[j],
                "capacity": caps[j],
                "locality": locality_value(
                    repo in table.repos_owned[i], repo in table.repos_replica[i], strat
                ),
                "label_match": labs[j],
            },
        )
        for j, i in enumerate(picks)
    ]
    name, s, b = rows[0]
    return Placement(
        node=name,
        score=s,
        breakdown=b,
        runners_up=rows[1:],
        reason=chosen_reason(strat, name, s, b, k, len(table)),
        strategy=strat.value,
        feasible=k,
    )


def _top4(score: np.ndarray) -> list[int]:
    """Indices of the (up to) 4 best positive scores, by quantised score then index (= name).

    Four argmax rounds, not argpartition: introselect degrades badly on the many equal
    values (zeros of filtered nodes, identical idle nodes) a real score vector has. Each
    round takes the first index whose score reaches the maximum's quantum, which is the
    lowest name among quantised ties. `score` is restored before returning.
    """
    out: list[int] = []
    saved: list[float] = []
    for _ in range(min(4, score.size)):
        top = float(score[int(np.argmax(score))])
        if top < QUANTUM:
            break
        j = int(np.argmax(score >= quantise(top)))
        out.append(j)
        saved.append(float(score[j]))
        score[j] = 0.0
    score[out] = saved
    return out


def _why_not(table: NodeTable, req: TaskRequest, static: np.ndarray) -> Unschedulable:
    """Slow path: re-apply the resource filters in order to name the one that emptied the set."""
    cand = table.alive & table.runnable
    m = static & (table.cpu_free >= req.cpu - EPS)
    if not m.any():
        best = float(table.cpu_free[cand].max()) if cand.any() else 0.0
        return Unschedulable(reason_cpu(req, best), "cpu")
    m &= table.mem_free >= req.memory_mb - EPS
    if not m.any():
        best = float(table.mem_free[cand].max()) if cand.any() else 0.0
        return Unschedulable(reason_mem(req, best), "memory")
    m &= table.has_slot
    if m.any():
        return Unschedulable(REASON_HEALTH, "health")
    return Unschedulable(REASON_SLOT, "runner")


# --- plain Python baseline -----------------------------------------------------------------


def place_plain(
    nodes: Sequence[NodeInfo],
    request: TaskRequest,
    *,
    strategy: str | Strategy | None = None,
    rr_counter: int = 0,
) -> Placement | Unschedulable:
    """Same algorithm, one node at a time, no numpy: the benchmark's baseline."""
    strat = Strategy(strategy or request.strategy)
    if not nodes:
        return Unschedulable(REASON_EMPTY, "empty")
    cand = [n for n in nodes if n.alive]
    if not cand:
        return Unschedulable(REASON_ALIVE, "alive")
    cand = [n for n in cand if n.role in ROLES_RUNNING_TASKS]
    if not cand:
        return Unschedulable(REASON_ROLE, "role")
    runnable = cand
    reqs = sorted(request.requires)
    for cap in reqs:
        cand = [n for n in cand if cap in n.capabilities]
        if not cand:
            missing = [c for c in reqs if not any(c in n.capabilities for n in runnable)]
            return Unschedulable(reason_cap(missing or reqs), "capability")
    base = cand
    items = sorted(request.labels.items())
    for k, v in items:
        cand = [n for n in cand if n.labels.get(k) == v]
        if not cand:
            missing = [(a, b) for a, b in items if not any(n.labels.get(a) == b for n in base)]
            return Unschedulable(reason_labels(missing or items), "label")
    cpu_cand = [n for n in cand if (n.cpu_total - n.cpu_used) >= request.cpu - EPS]
    if not cpu_cand:
        best = max((n.cpu_total - n.cpu_used for n in runnable), default=0.0)
        return Unschedulable(reason_cpu(request, best), "cpu")
    mem_cand = [n for n in cpu_cand if (n.mem_total_mb - n.mem_used_mb) >= request.memory_mb - EPS]
    if not mem_cand:
        best = max((n.mem_total_mb - n.mem_used_mb for n in runnable), default=0.0)
        return Unschedulable(reason_mem(request, best), "memory")
    cand = [n for n in mem_cand if n.runners_used < n.runners_total]
    if not cand:
        return Unschedulable(REASON_SLOT, "runner")
    scored: list[tuple[float, str, Breakdown]] = []
    for n in cand:
        bd = _breakdown_plain(n, request, strat)
        s = quantise(((bd["health"] * bd["locality"]) * bd["capacity"]) * bd["label_match"])
        if s > 0:
            scored.append((s, n.name, bd))
    if not scored:
        return Unschedulable(REASON_HEALTH, "health")
    if strat is Strategy.ROUND_ROBIN:
        scored.sort(key=lambda t: t[1])
        chosen = scored[rr_counter % len(scored)]
    else:
        chosen = min(scored, key=lambda t: (-t[0], t[1]))
    rest = heapq.nsmallest(4, scored, key=lambda t: (-t[0], t[1]))
    runners_up = [(name, s, bd) for s, name, bd in rest if name != chosen[1]][:3]
    s, name, b = chosen
    return Placement(
        node=name,
        score=s,
        breakdown=b,
        runners_up=runners_up,
        reason=chosen_reason(strat, name, s, b, len(scored), len(nodes)),
        strategy=strat.value,
        feasible=len(scored),
    )


def _breakdown_plain(n: NodeInfo, req: TaskRequest, strat: Strategy) -> Breakdown:
    """Factors for one node, with the float operations of `place` in the same order."""
    inv_c = 1.0 / n.cpu_total if n.cpu_total > 0 else 0.0
    inv_m = 1.0 / n.mem_total_mb if n.mem_total_mb > 0 else 0.0
    inv_r = 1.0 / float(n.runners_total) if n.runners_total > 0 else 0.0
    free_c = n.cpu_total - n.cpu_used
    free_m = n.mem_total_mb - n.mem_used_mb
    if strat is Strategy.BEST_FIT:
        cap = binpack_scalar(
            (free_c - req.cpu) * (inv_c * LN10), (free_m - req.memory_mb) * (inv_m * LN10)
        )
    else:
        fr = ((n.runners_total - n.runners_used) - 1) * inv_r
        cap = spread_scalar((free_c - req.cpu) * inv_c, (free_m - req.memory_mb) * inv_m, fr)
        if strat is Strategy.LOCALITY:
            cap = locality_capacity_scalar(cap)
    return {
        "health": min(max(float(n.health), 0.0), 1.0),
        "capacity": cap,
        "locality": locality_value(req.repo in n.repos_owned, req.repo in n.repos_replica, strat),
        "label_match": label_match_scalar(dict(n.labels), dict(req.prefer)),
    }


def apply_plain(nodes: list[NodeInfo], index: int, req: TaskRequest) -> None:
    """The plain twin of `NodeTable.apply`: same float operations, so states stay identical."""
    n = nodes[index]
    nodes[index] = replace(
        n,
        cpu_used=n.cpu_used + req.cpu,
        mem_used_mb=n.mem_used_mb + req.memory_mb,
        runners_used=n.runners_used + 1,
    )


# --- fragmentation -------------------------------------------------------------------------


def fragmentation(table: NodeTable, pending: Sequence[TaskRequest]) -> float:
    """Share of free capacity stranded on nodes that cannot fit any pending task.

    Measured separately for cpu and memory (each as a fraction of that resource's total
    free on alive task-running nodes) and averaged. 0 = every free unit is usable.
    """
    if not pending:
        return 0.0
    cand = table.alive & table.runnable
    cpu_free = np.where(cand, np.clip(table.cpu_total - table.cpu_used, 0.0, None), 0.0)
    mem_free = np.where(cand, np.clip(table.mem_total - table.mem_used, 0.0, None), 0.0)
    slot = table.runners_used < table.runners_total
    fits = np.zeros(len(table), dtype=bool)
    for cpu, mem in sorted({(t.cpu, t.memory_mb) for t in pending}):
        fits |= (cpu_free >= cpu - EPS) & (mem_free >= mem - EPS)
    fits &= slot & cand
    parts = []
    for free in (cpu_free, mem_free):
        total = free.sum()
        if total > 0:
            parts.append(float(free[~fits].sum() / total))
    return float(np.mean(parts)) if parts else 0.0
