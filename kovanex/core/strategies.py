"""Placement strategies: how capacity and locality turn into factors in [0, 1].

Each formula exists twice, vectorised (numpy, for `scoring.place`) and scalar (plain
Python, for `scoring.place_plain`), written with the same operation order so the two
agree up to the last bits of `10 ** x`; scores are then quantised (`quantise`) so a
last-bit difference cannot reorder nodes.
"""

from __future__ import annotations

import math
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


def quantise_vec(x: np.ndarray) -> np.ndarray:
    return np.floor(x / QUANTUM) * QUANTUM


# --- capacity ----------------------------------------------------------------------------


def binpack_vec(fc: np.ndarray, fm: np.ndarray) -> np.ndarray:
    """Nomad's binpack on post-placement free fractions: 20 - (10^fc + 10^fm), in [0,18] / 18."""
    raw = 20.0 - (np.power(10.0, fc) + np.power(10.0, fm))
    return CAPACITY_FLOOR + (1.0 - CAPACITY_FLOOR) * (np.clip(raw, 0.0, 18.0) / 18.0)


def binpack_scalar(fc: float, fm: float) -> float:
    raw = 20.0 - (10.0**fc + 10.0**fm)
    return CAPACITY_FLOOR + (1.0 - CAPACITY_FLOOR) * (min(max(raw, 0.0), 18.0) / 18.0)


def spread_vec(fc: np.ndarray, fm: np.ndarray, fr: np.ndarray) -> np.ndarray:
    """Mean free fraction (cpu, memory, runner slots) left after placement: emptiest wins."""
    return CAPACITY_FLOOR + (1.0 - CAPACITY_FLOOR) * ((fc + fm + fr) / 3.0)


def spread_scalar(fc: float, fm: float, fr: float) -> float:
    return CAPACITY_FLOOR + (1.0 - CAPACITY_FLOOR) * ((fc + fm + fr) / 3.0)


def capacity_vec(strategy: Strategy, fc: np.ndarray, fm: np.ndarray, fr: np.ndarray) -> np.ndarray:
    if strategy is Strategy.BEST_FIT:
        return binpack_vec(fc, fm)
    s = spread_vec(fc, fm, fr)
    if strategy is Strategy.LOCALITY:
        return 0.5 + 0.5 * s  # only separates nodes of equal locality
    return s


def capacity_scalar(strategy: Strategy, fc: float, fm: float, fr: float) -> float:
    if strategy is Strategy.BEST_FIT:
        return binpack_scalar(fc, fm)
    s = spread_scalar(fc, fm, fr)
    if strategy is Strategy.LOCALITY:
        return 0.5 + 0.5 * s
    return s


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
