"""Seed sweeps of the whole-cluster simulator on every core: each seed is independent and
deterministic, so `make test` can run its hundreds of seeds in worker processes and the
per-seed tests only read their verdicts (same seeds, same checks, half the wall time on
the 2-core CI box). Kept apart from conftest so that workers import nothing of pytest's."""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable, Iterable
from concurrent.futures import ProcessPoolExecutor
from typing import Any, TypeVar

from kovanex.sim.run import simulate

T = TypeVar("T")


def verdict(seed: int, opts: dict[str, Any]) -> str | None:
    """None when every invariant holds for the seed, else what failed and how to replay it."""
    r = simulate(seed, **opts)
    if r.ok:
        return None
    flag = f" --ownership {opts['ownership']}" if opts.get("ownership") else ""
    return "\n".join(
        [
            r.scenario.describe(),
            *r.violations,
            f"replay: python -m kovanex.sim --seed {seed}{flag} --log",
        ]
    )


def sweep(seeds: Iterable[int], **opts: Any) -> dict[int, str | None]:
    """Each seed's verdict, on every core."""
    seeds = list(seeds)
    return _pooled(verdict, seeds, [opts] * len(seeds))


def _pooled(fn: Callable[..., T], seeds: list[int], *more: list[Any]) -> dict[int, T]:
    """fn(seed, ...) for every seed in worker processes. They are spawned, not forked: the
    test process has threads (event readers, agent helpers) that a fork copies mid-lock."""
    workers = min(len(seeds), os.cpu_count() or 1)
    if workers <= 1:
        return {s: fn(s, *(m[i] for m in more)) for i, s in enumerate(seeds)}
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(workers, mp_context=ctx) as pool:
        chunk = max(1, len(seeds) // (workers * 8))
        return dict(zip(seeds, pool.map(fn, seeds, *more, chunksize=chunk), strict=True))


def lease_facts(seed: int) -> tuple[list[str], str, bool]:
    """What the lease tests read of one seed: its violations, the lease model's summary,
    and whether a node halted a job (the log is too big to send back whole)."""
    r = simulate(seed)
    return r.violations, r.lease, any(": halted j" in line for line in r.log)


def lease_sweep(seeds: Iterable[int]) -> dict[int, tuple[list[str], str, bool]]:
    return _pooled(lease_facts, list(seeds))
