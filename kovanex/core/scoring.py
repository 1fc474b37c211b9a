"""Placement core: score = health x capacity x locality x label_match, vectorised over nodes.

Hard constraints are filters applied first, in a fixed order, so a zero score always
means "infeasible" and an unschedulable task is explained by the filter that removed
the last candidates. `place` (numpy) and `place_plain` (pure Python, the benchmark
baseline) return the same placements; tests assert it.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from kovanex.core.strategies import (
    PREFER_PENALTY,
    ROLES_RUNNING_TASKS,
    Strategy,
    capacity_scalar,
    capacity_vec,
    label_match_scalar,
    locality_value,
    locality_vec,
    quantise,
    quantise_vec,
)

EPS = 1e-9  # resource comparisons tolerate float dust from repeated apply/release
FACTORS = ("health", "capacity", "locality", "label_match")


@dataclass(frozen=True, slots=True)
class NodeInfo:
    """What the scheduler knows about one node (from gossip and the health matrix)."""

    name: str
    role: str = "FULL"  # FULL | SERVER | RUNNER | STORAGE
    labels: Mapping[str, str] = field(default_factory=dict)
    capabilities: frozenset[str] = frozenset()
    health: float = 1.0
    cpu_total: float = 0.0
    cpu_used: float = 0.0
    mem_total_mb: float = 0.0
    mem_used_mb: float = 0.0
    runners_total: int = 0
    runners_used: int = 0
    repos_owned: frozenset[str] = frozenset()
    repos_replica: frozenset[str] = frozenset()
    alive: bool = True


@dataclass(frozen=True, slots=True)
class TaskRequest:
    """One task to place. `labels` are required (hard); `prefer` labels only lower the score."""

    task_id: str
    repo: str
    labels: Mapping[str, str] = field(default_factory=dict)
    requires: frozenset[str] = frozenset()
    cpu: float = 1.0
    memory_mb: float = 0.0
    strategy: str = Strategy.BEST_FIT.value
    priority: int = 0  # recorded; ordering among pending tasks is the caller's queue
    prefer: Mapping[str, str] = field(default_factory=dict)


Breakdown = dict[str, float]


@dataclass(frozen=True, slots=True)
class Placement:
    node: str
    score: float
    breakdown: Breakdown
    runners_up: list[tuple[str, float, Breakdown]]
    reason: str
    strategy: str = Strategy.BEST_FIT.value
    feasible: int = 0


@dataclass(frozen=True, slots=True)
class Unschedulable:
    reason: str
    stage: str  # which filter emptied the candidate set


# --- filter reasons (shared by both implementations so messages are identical) ------------


def _fmt_num(x: float) -> str:
    return f"{x:.1f}" if float(x) != int(x) or x < 100 else f"{int(x)}"


def _reason_cap(missing: Sequence[str]) -> str:
    if len(missing) == 1:
        return f"no node provides capability {missing[0]}"
    return "no node provides all of capabilities " + ", ".join(missing)


def _reason_labels(missing: Sequence[tuple[str, str]]) -> str:
    if len(missing) == 1:
        return f"no node has label {missing[0][0]}={missing[0][1]}"
    return "no node has all of labels " + ", ".join(f"{k}={v}" for k, v in missing)


def _reason_cpu(req: TaskRequest, best: float) -> str:
    return f"no node has {float(req.cpu):.1f} free cpu (most free: {best:.1f})"


def _reason_mem(req: TaskRequest, best: float) -> str:
    return f"no node has {_fmt_num(req.memory_mb)} MB free memory (most free: {best:.0f} MB)"


REASON_EMPTY = "no nodes in the cluster"
REASON_ALIVE = "no alive node"
REASON_ROLE = "no alive node can run tasks (only SERVER/STORAGE roles)"
REASON_SLOT = "no node has a free runner slot"
REASON_HEALTH = "every feasible node reports health 0"


def _chosen_reason(
    strategy: Strategy, node: str, score: float, bd: Breakdown, k: int, n: int
) -> str:
    f = " x ".join(f"{name} {bd[name]:.2f}" for name in FACTORS)
    return f"{strategy.value}: {node} score {score:.3f} = {f}; {k}/{n} nodes feasible"


# --- the struct-of-arrays table -----------------------------------------------------------


class NodeTable:
    """All nodes as parallel numpy arrays, sorted by name (index order = tie-break order)."""

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
        self.inv_run = _inv(self.runners_total.astype(f64))
        n = len(ordered)
        self._cap: dict[str, np.ndarray] = {}
        self._label: dict[tuple[str, str], np.ndarray] = {}
        for i, node in enumerate(ordered):
            for c in node.capabilities:
                self._cap.setdefault(c, np.zeros(n, dtype=bool))[i] = True
            for kv in node.labels.items():
                self._label.setdefault(kv, np.zeros(n, dtype=bool))[i] = True
        owners: dict[str, list[int]] = {}
        replicas: dict[str, list[int]] = {}
        for i, node in enumerate(ordered):
            for r in node.repos_owned:
                owners.setdefault(r, []).append(i)
            for r in node.repos_replica:
                replicas.setdefault(r, []).append(i)
        self._owners = {r: np.array(v, dtype=np.int64) for r, v in owners.items()}
        self._replicas = {r: np.array(v, dtype=np.int64) for r, v in replicas.items()}
        self._static: dict[tuple, tuple[np.ndarray | None, Unschedulable | None]] = {}
        self._loc: dict[tuple[str, Strategy], np.ndarray] = {}

    @classmethod
    def from_nodes(cls, nodes: Iterable[NodeInfo]) -> NodeTable:
        return cls(nodes)

    def __len__(self) -> int:
        return len(self.names)

    def _i(self, node: str | int) -> int:
        return node if isinstance(node, int) else self.index[node]

    def apply(self, node: str | int, req: TaskRequest) -> None:
        """Account a placed task on `node` so the next placement sees the reduced capacity."""
        i = self._i(node)
        self.cpu_used[i] += req.cpu
        self.mem_used[i] += req.memory_mb
        self.runners_used[i] += 1

    def release(self, node: str | int, req: TaskRequest) -> None:
        i = self._i(node)
        self.cpu_used[i] -= req.cpu
        self.mem_used[i] -= req.memory_mb
        self.runners_used[i] -= 1

    def set_alive(self, node: str, alive: bool) -> None:
        self.alive[self.index[node]] = alive
        self._static.clear()

    def set_health(self, node: str, health: float) -> None:
        self.health[self.index[node]] = min(max(float(health), 0.0), 1.0)

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
        key = (frozenset(req.requires), tuple(sorted(req.labels.items())))
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
        for cap in sorted(req.requires):
            m = m & self._cap.get(cap, False)
            if not m.any():
                missing = [
                    c for c in sorted(req.requires) if not (base & self._cap.get(c, False)).any()
                ]
                return None, Unschedulable(
                    _reason_cap(missing or sorted(req.requires)), "capability"
                )
        base = m
        for kv in sorted(req.labels.items()):
            m = m & self._label.get(kv, False)
            if not m.any():
                items = sorted(req.labels.items())
                missing = [p for p in items if not (base & self._label.get(p, False)).any()]
                return None, Unschedulable(_reason_labels(missing or items), "label")
        return m, None

    def locality(self, repo: str, strategy: Strategy) -> np.ndarray:
        key = (repo, strategy)
        loc = self._loc.get(key)
        if loc is None:
            loc = locality_vec(
                len(self), self._owners.get(repo), self._replicas.get(repo), strategy
            )
            self._loc[key] = loc
        return loc

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
    m, why = table.static_mask(request)
    if why is not None:
        return why
    cpu_free = table.cpu_total - table.cpu_used
    m = m & (cpu_free >= request.cpu - EPS)
    if not m.any():
        return Unschedulable(_reason_cpu(request, _best(cpu_free, table)), "cpu")
    mem_free = table.mem_total - table.mem_used
    m &= mem_free >= request.memory_mb - EPS
    if not m.any():
        return Unschedulable(_reason_mem(request, _best(mem_free, table)), "memory")
    m &= table.runners_used < table.runners_total
    if not m.any():
        return Unschedulable(REASON_SLOT, "runner")
    fc = (cpu_free - request.cpu) * table.inv_cpu
    fm = (mem_free - request.memory_mb) * table.inv_mem
    fr = ((table.runners_total - table.runners_used) - 1) * table.inv_run
    cap = capacity_vec(strat, fc, fm, fr)
    loc = table.locality(request.repo, strat)
    lab = table.label_match(request.prefer)
    score = quantise_vec(table.health * cap * loc * lab) * m
    feasible = np.flatnonzero(score > 0)
    k = feasible.size
    if k == 0:
        return Unschedulable(REASON_HEALTH, "health")
    if strat is Strategy.ROUND_ROBIN:
        best = int(feasible[rr_counter % k])
    else:
        best = int(np.argmax(score))  # first maximum = lowest name
    top = _top(score, feasible, best, 3)

    def bd(i: int) -> Breakdown:
        lm = float(lab if isinstance(lab, float) else lab[i])
        return {
            "health": float(table.health[i]),
            "capacity": float(cap[i]),
            "locality": float(loc[i]),
            "label_match": lm,
        }

    name, s, b = table.names[best], float(score[best]), bd(best)
    return Placement(
        node=name,
        score=s,
        breakdown=b,
        runners_up=[(table.names[i], float(score[i]), bd(i)) for i in top],
        reason=_chosen_reason(strat, name, s, b, k, len(table)),
        strategy=strat.value,
        feasible=k,
    )


def _best(free: np.ndarray, table: NodeTable) -> float:
    cand = table.alive & table.runnable
    return float(free[cand].max()) if cand.any() else 0.0


def _top(score: np.ndarray, feasible: np.ndarray, exclude: int, k: int) -> list[int]:
    """Indices of the k best feasible nodes other than `exclude`, by score then name."""
    cand = feasible[feasible != exclude]
    if cand.size > k:
        part = np.argpartition(-score[cand], k - 1)[:k]
        # argpartition breaks ties arbitrarily: widen to every node tied with the k-th.
        kth = score[cand[part]].min()
        cand = cand[score[cand] >= kth]
    order = np.lexsort((cand, -score[cand]))
    return [int(i) for i in cand[order[:k]]]


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
            return Unschedulable(_reason_cap(missing or reqs), "capability")
    base = cand
    items = sorted(request.labels.items())
    for k, v in items:
        cand = [n for n in cand if n.labels.get(k) == v]
        if not cand:
            missing = [(a, b) for a, b in items if not any(n.labels.get(a) == b for n in base)]
            return Unschedulable(_reason_labels(missing or items), "label")
    cpu_cand = [n for n in cand if (n.cpu_total - n.cpu_used) >= request.cpu - EPS]
    if not cpu_cand:
        best = max((n.cpu_total - n.cpu_used for n in runnable), default=0.0)
        return Unschedulable(_reason_cpu(request, best), "cpu")
    mem_cand = [n for n in cpu_cand if (n.mem_total_mb - n.mem_used_mb) >= request.memory_mb - EPS]
    if not mem_cand:
        best = max((n.mem_total_mb - n.mem_used_mb for n in runnable), default=0.0)
        return Unschedulable(_reason_mem(request, best), "memory")
    cand = [n for n in mem_cand if n.runners_used < n.runners_total]
    if not cand:
        return Unschedulable(REASON_SLOT, "runner")
    scored: list[tuple[float, str, Breakdown]] = []
    for n in cand:
        bd = _breakdown_plain(n, request, strat)
        s = quantise(bd["health"] * bd["capacity"] * bd["locality"] * bd["label_match"])
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
        reason=_chosen_reason(strat, name, s, b, len(scored), len(nodes)),
        strategy=strat.value,
        feasible=len(scored),
    )


def _breakdown_plain(n: NodeInfo, req: TaskRequest, strat: Strategy) -> Breakdown:
    inv_c = 1.0 / n.cpu_total if n.cpu_total > 0 else 0.0
    inv_m = 1.0 / n.mem_total_mb if n.mem_total_mb > 0 else 0.0
    inv_r = 1.0 / float(n.runners_total) if n.runners_total > 0 else 0.0
    fc = ((n.cpu_total - n.cpu_used) - req.cpu) * inv_c
    fm = ((n.mem_total_mb - n.mem_used_mb) - req.memory_mb) * inv_m
    fr = ((n.runners_total - n.runners_used) - 1) * inv_r
    return {
        "health": min(max(float(n.health), 0.0), 1.0),
        "capacity": capacity_scalar(strat, fc, fm, fr),
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
