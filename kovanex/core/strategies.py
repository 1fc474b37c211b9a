"""Placement vocabulary (nodes, requests, results, reasons) and the factor formulas.

Strategies decide how capacity and locality turn into factors in [0, 1].

Each formula exists twice, vectorised (numpy, for `scoring.place`) and scalar (plain
Python, for `scoring.place_plain`), written with the same operation order so the two
agree up to the last bit of `exp`; scores are then quantised (`quantise`) so a
last-bit difference cannot reorder nodes.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

import numpy as np


class Strategy(StrEnum):
    BEST_FIT = "best-fit"  # bin-pack: fullest node that fits (Nomad binpack)
    LOCALITY = "locality"  # data locality dominates; load spread among equals
    ROUND_ROBIN = "round-robin"  # deterministic rotation over feasible nodes (caller's counter)
    SPREAD = "spread"  # emptiest node, fewest tasks


ROLES_RUNNING_TASKS = frozenset({"FULL", "RUNNER"})
ROLES = ("FULL", "SERVER", "RUNNER", "STORAGE")

LOCALITY_OWNER = 1.0
LOCALITY_REPLICA = 0.7
LOCALITY_REMOTE = 0.3
LOCALITY_EXPONENT = 3  # locality strategy: 1.0 / 0.343 / 0.027, so it outweighs load

# A feasible node never scores exactly 0: a zero score means "filtered out".
CAPACITY_FLOOR = 0.05
PREFER_PENALTY = 0.5  # label_match when none of the preferred labels match

QUANTUM = 2.0**-40


def quantise(x: float) -> float:
    """Round a score down to a multiple of 2^-40 so numpy and plain Python rank identically."""
    return math.floor(x / QUANTUM) * QUANTUM


# --- the placement vocabulary ------------------------------------------------------------

EPS = 1e-9  # resource comparisons tolerate float dust from repeated apply/release
HEALTH_FLOOR = 1e-6  # above it, any feasible node's score is >= QUANTUM
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
    # CordonNode: known, but takes no new task. The scoring table never sees a cordoned
    # node (placing.decide leaves it out); it is here so "why not" can name the cordon.
    cordoned: bool = False


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


def reason_cap(missing: Sequence[str]) -> str:
    if len(missing) == 1:
        return f"no node provides capability {missing[0]}"
    return "no node provides all of capabilities " + ", ".join(missing)


def reason_labels(missing: Sequence[tuple[str, str]]) -> str:
    if len(missing) == 1:
        return f"no node has label {missing[0][0]}={missing[0][1]}"
    return "no node has all of labels " + ", ".join(f"{k}={v}" for k, v in missing)


def reason_cpu(req: TaskRequest, best: float) -> str:
    return f"no node has {float(req.cpu):.1f} free cpu (most free: {best:.1f})"


def reason_mem(req: TaskRequest, best: float) -> str:
    return f"no node has {_fmt_num(req.memory_mb)} MB free memory (most free: {best:.0f} MB)"


REASON_EMPTY = "no nodes in the cluster"


def reason_cordoned(names: Sequence[str]) -> str:
    """Why nothing was placed when only cordoned nodes could have taken the task."""
    which = ", ".join(sorted(names))
    return (
        f"only cordoned nodes could run this task ({which}); "
        "`kovanex node uncordon NAME` lets one take it"
    )


REASON_ALIVE = "no alive node"
REASON_ROLE = "no alive node can run tasks (only SERVER/STORAGE roles)"
REASON_SLOT = "no node has a free runner slot"
REASON_HEALTH = "every feasible node reports health 0"


def chosen_reason(
    strategy: Strategy, node: str, score: float, bd: Breakdown, k: int, n: int
) -> str:
    return (
        f"{strategy.value}: {node} score {score:.3f} = health {bd['health']:.2f}"
        f" x capacity {bd['capacity']:.2f} x locality {bd['locality']:.2f}"
        f" x label_match {bd['label_match']:.2f}; {k}/{n} nodes feasible"
    )


# --- capacity ----------------------------------------------------------------------------
# Inputs are post-placement free fractions: fc (cpu), fm (memory), fr (runner slots).
# Best-fit takes fc and fm pre-multiplied by ln 10 (10^x = e^(x ln 10): numpy's exp is
# vectorised, its power is not).

LN10 = math.log(10.0)
_KB = (1.0 - CAPACITY_FLOOR) / 18.0
_KS = (1.0 - CAPACITY_FLOOR) / 3.0


def binpack_vec(fc_ln: np.ndarray, fm_ln: np.ndarray) -> np.ndarray:
    """Nomad's binpack: 20 - (10^fc + 10^fm), clamped to [0, 18] and scaled to [floor, 1].

    Works in place on `fc_ln` (a scratch buffer) to avoid allocations on the hot path.
    """
    raw = np.exp(fc_ln, out=fc_ln)
    raw += np.exp(fm_ln, out=fm_ln)
    np.subtract(20.0, raw, out=raw)
    np.clip(raw, 0.0, 18.0, out=raw)
    raw *= _KB
    raw += CAPACITY_FLOOR
    return raw


def binpack_scalar(fc_ln: float, fm_ln: float) -> float:
    """Scalar twin of `binpack_vec` (same ln 10 pre-multiplied inputs)."""
    raw = 20.0 - (math.exp(fc_ln) + math.exp(fm_ln))
    return CAPACITY_FLOOR + min(max(raw, 0.0), 18.0) * _KB


def spread_vec(fc: np.ndarray, fm: np.ndarray, fr: np.ndarray) -> np.ndarray:
    """Mean free fraction (cpu, memory, runner slots) left after placement: emptiest wins."""
    s = fc + fm
    s += fr
    s *= _KS
    s += CAPACITY_FLOOR
    return s


def spread_scalar(fc: float, fm: float, fr: float) -> float:
    return CAPACITY_FLOOR + ((fc + fm) + fr) * _KS


def locality_capacity_vec(s: np.ndarray) -> np.ndarray:
    """Locality strategy: load only separates nodes of equal locality."""
    s *= 0.5
    s += 0.5
    return s


def locality_capacity_scalar(s: float) -> float:
    return 0.5 + s * 0.5


# --- locality ----------------------------------------------------------------------------


def locality_value(owner: bool, replica: bool, strategy: Strategy) -> float:
    base = LOCALITY_OWNER if owner else LOCALITY_REPLICA if replica else LOCALITY_REMOTE
    if strategy is Strategy.LOCALITY:
        return base**LOCALITY_EXPONENT
    return base


def locality_vec(
    n: int, owners: np.ndarray | None, replicas: np.ndarray | None, strategy: Strategy
) -> np.ndarray:
    """Per-node locality factor; owner wins over replica when a node is both."""
    loc = np.full(n, locality_value(False, False, strategy))
    if replicas is not None:
        loc[replicas] = locality_value(False, True, strategy)
    if owners is not None:
        loc[owners] = locality_value(True, False, strategy)
    return loc


def label_match_scalar(labels: dict[str, str], prefer: dict[str, str]) -> float:
    """1.0 when every preferred (soft) label matches; down to PREFER_PENALTY when none do."""
    if not prefer:
        return 1.0
    hits = sum(1 for k, v in prefer.items() if labels.get(k) == v)
    return 1.0 - PREFER_PENALTY * ((len(prefer) - hits) / len(prefer))
