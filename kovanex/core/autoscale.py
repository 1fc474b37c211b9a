"""Should the cluster have more runners, or fewer? The autoscaling decider, pure.

Queue pressure is pending tasks ÷ available (free) runner slots. Two checks read its
history and each suggests a runner count: the seed's asymmetric thresholds (up when above
0.8 for 2 min, down when below 0.2 for 10 min) and, when configured, the Kubernetes HPA
formula `desired = ceil(current × pressure / target)` with a tolerance band. As in the
Nomad Autoscaler the safest suggestion wins (the one that keeps most capacity: up beats
hold beats down), then guards shape it: HPA's scale-down stabilisation (the highest
suggestion in the window), the Cluster Autoscaler's cooldown after a scale-up, and the
pool's bounds. Every check and guard reports whether it fired and why (ADR 0025).

The shell (kovanex/agent/scaling.py) feeds samples and `now`; this module reads no clock.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

CHECKS = ("seed", "hpa")
UP, DOWN, NONE = "up", "down", "none"
RANK = {UP: 2, NONE: 1, DOWN: 0}  # Nomad: ScaleOut > ScaleNone > ScaleIn


class PolicyError(ValueError):
    """A `[scaling]` value out of range; the message names the field and its limit."""


@dataclass(frozen=True)
class Policy:
    """`[scaling]` in kovanex.toml. Defaults: the seed's rules; HPA and K8s/CA timings."""

    checks: tuple[str, ...] = ("seed",)
    up_threshold: float = 0.8
    up_for_s: float = 120.0
    down_threshold: float = 0.2
    down_for_s: float = 600.0
    target: float = 0.5  # HPA target pressure (check "hpa")
    tolerance: float = 0.1  # HPA: no change while |pressure/target - 1| <= this
    stabilization_s: float = 300.0  # HPA: scale down to the highest suggestion in this window
    cooldown_s: float = 600.0  # Cluster Autoscaler: no scale-down this long after a scale-up
    up_cooldown_s: float = 60.0  # no second scale-up before the first runner can join
    step: int = 1  # runners added or removed by a seed rule
    min_runners: int = 0
    max_runners: int = 10
    sample_s: float = 10.0
    history: int = 360  # samples kept (the pressure history GetScaleDecision returns)
    executor: str = ""  # command; "" = the shipped `python -m kovanex.scale_executor`
    executor_timeout_s: float = 120.0

    def check(self, where: str = "[scaling]") -> Policy:
        """Refuse values that make no sense, naming the field and the limit."""
        unknown = [c for c in self.checks if c not in CHECKS]
        if unknown or not self.checks:
            raise PolicyError(
                f"{where} checks = {list(self.checks)!r}: each must be one of "
                f"{', '.join(CHECKS)}, and at least one is needed"
            )
        _range(where, "up_threshold", self.up_threshold, 0.0, None)
        _range(where, "down_threshold", self.down_threshold, 0.0, None)
        if self.down_threshold >= self.up_threshold:
            raise PolicyError(
                f"{where} down_threshold ({self.down_threshold}) must be below "
                f"up_threshold ({self.up_threshold})"
            )
        for name in ("up_for_s", "down_for_s", "stabilization_s", "cooldown_s", "up_cooldown_s"):
            _range(where, name, getattr(self, name), 0.0, 86400.0)
        _range(where, "target", self.target, 0.01, None)
        _range(where, "tolerance", self.tolerance, 0.0, 0.99)
        _range(where, "sample_s", self.sample_s, 0.05, 3600.0)
        _range(where, "executor_timeout_s", self.executor_timeout_s, 1.0, 3600.0)
        _range(where, "step", self.step, 1, 1000)
        _range(where, "history", self.history, 2, 100_000)
        _range(where, "min_runners", self.min_runners, 0, 10_000)
        _range(where, "max_runners", self.max_runners, self.min_runners, 10_000)
        return self

    @classmethod
    def from_table(cls, table: Mapping[str, Any], where: str = "[scaling]") -> Policy:
        """Build from a TOML table: unknown keys and wrong types are errors, not ignored."""
        base = cls()
        kw: dict[str, Any] = {}
        for key, raw in table.items():
            if not hasattr(base, key):
                raise PolicyError(f"{where} has no field {key!r}")
            want = getattr(base, key)
            if isinstance(want, tuple):
                if not isinstance(raw, list) or not all(isinstance(x, str) for x in raw):
                    raise PolicyError(f'{where} {key} must be a list of names, e.g. ["seed"]')
                kw[key] = tuple(raw)
            elif isinstance(want, str):
                if not isinstance(raw, str):
                    raise PolicyError(f"{where} {key} must be a string")
                kw[key] = raw
            elif isinstance(want, int) and not isinstance(want, bool):
                if not isinstance(raw, int) or isinstance(raw, bool):
                    raise PolicyError(f"{where} {key} must be an integer, not {raw!r}")
                kw[key] = raw
            else:
                if not isinstance(raw, int | float) or isinstance(raw, bool):
                    raise PolicyError(f"{where} {key} must be a number, not {raw!r}")
                kw[key] = float(raw)
        return replace(base, **kw).check(where)

    def changed(self) -> dict[str, Any]:
        """Fields that differ from the defaults (what `to_toml` writes back)."""
        base = Policy()
        return {
            k: list(v) if isinstance(v, tuple) else v
            for k in self.__dataclass_fields__
            if (v := getattr(self, k)) != getattr(base, k)
        }


def _range(where: str, name: str, v: float, lo: float, hi: float | None) -> None:
    if v < lo or (hi is not None and v > hi) or (isinstance(v, float) and math.isnan(v)):
        limit = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"
        raise PolicyError(f"{where} {name} = {v!r} must be {limit}")


def pressure(pending: int, free: int) -> float:
    """pending ÷ free runner slots; with no free slot each pending task counts as 1."""
    if pending <= 0:
        return 0.0
    return pending / max(free, 1)


@dataclass(frozen=True)
class Sample:
    t: float
    pending: int
    free: int
    current: int  # runner nodes in the pool when sampled
    pressure: float
    suggested: int  # the checks' safest count at this sample (for stabilisation)

    def as_dict(self) -> dict[str, Any]:
        return {
            "time": self.t,
            "pending": self.pending,
            "free": self.free,
            "runners": self.current,
            "pressure": round(self.pressure, 4),
        }


@dataclass(frozen=True)
class State:
    samples: tuple[Sample, ...] = ()
    last_up: float | None = None  # when a scale-up was last applied
    last_down: float | None = None


@dataclass(frozen=True)
class Rule:
    """One check or guard: did it fire, what count it asks for, and why."""

    name: str
    fired: bool
    action: str
    desired: int
    reason: str

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "fired": self.fired,
            "action": self.action,
            "desired": self.desired,
            "reason": self.reason,
        }


@dataclass(frozen=True)
class Scale:
    """The effect: bring the runner pool from `current` to `desired`."""

    action: str
    current: int
    desired: int

    @property
    def delta(self) -> int:
        return self.desired - self.current

    def as_dict(self) -> dict[str, Any]:
        return {
            "action": self.action,
            "current": self.current,
            "desired": self.desired,
            "delta": self.delta,
        }


@dataclass(frozen=True)
class Decision:
    now: float
    pressure: float
    current: int
    recommendation: Scale
    rules: tuple[Rule, ...]
    effects: tuple[Scale, ...] = field(default=())

    def as_dict(self, history: tuple[Sample, ...] = ()) -> dict[str, Any]:
        return {
            "time": self.now,
            "pressure": round(self.pressure, 4),
            "runners": self.current,
            "recommendation": self.recommendation.as_dict(),
            "fired": [x.name for x in self.rules if x.fired],
            "rules": [x.as_dict() for x in self.rules],
            "history": [s.as_dict() for s in history],
        }


def direction(current: int, desired: int) -> str:
    return UP if desired > current else DOWN if desired < current else NONE


def _run_since(samples: tuple[Sample, ...], pred: Any) -> float | None:
    """When the newest unbroken run of samples matching `pred` began (None: newest fails)."""
    since = None
    for s in reversed(samples):
        if not pred(s.pressure):
            break
        since = s.t
    return since


def seed_check(samples: tuple[Sample, ...], p: Policy, now: float) -> Rule:
    """The seed's asymmetric rule: up after `up_for_s` above, down after `down_for_s` below."""
    last = samples[-1]
    cur, pr = last.current, last.pressure
    up = _run_since(samples, lambda x: x > p.up_threshold)
    if up is not None:
        held = now - up
        if held >= p.up_for_s:
            why = f"pressure {pr:.2f} > {p.up_threshold} for {held:.0f}s (needs {p.up_for_s:.0f}s)"
            return Rule("seed", True, UP, cur + p.step, why)
        why = f"pressure {pr:.2f} > {p.up_threshold} for {held:.0f}s of {p.up_for_s:.0f}s"
        return Rule("seed", False, NONE, cur, why)
    down = _run_since(samples, lambda x: x < p.down_threshold)
    if down is not None:
        held = now - down
        if held >= p.down_for_s:
            why = (
                f"pressure {pr:.2f} < {p.down_threshold} for {held:.0f}s "
                f"(needs {p.down_for_s:.0f}s)"
            )
            return Rule("seed", True, DOWN, max(cur - p.step, 0), why)
        why = f"pressure {pr:.2f} < {p.down_threshold} for {held:.0f}s of {p.down_for_s:.0f}s"
        return Rule("seed", False, NONE, cur, why)
    why = f"pressure {pr:.2f} within [{p.down_threshold}, {p.up_threshold}]"
    return Rule("seed", False, NONE, cur, why)


def hpa_check(last: Sample, p: Policy) -> Rule:
    """Kubernetes HPA: desired = ceil(current × pressure / target), outside the tolerance."""
    cur, ratio = last.current, last.pressure / p.target
    if abs(ratio - 1.0) <= p.tolerance + 1e-9:  # 0.55/0.5 is 1.1000000000000003
        why = f"pressure/target = {ratio:.2f}, within 1 ± {p.tolerance}"
        return Rule("hpa", False, NONE, cur, why)
    # an empty pool with work waiting counts as one runner: HPA cannot scale from zero
    base = cur if cur > 0 or last.pressure == 0 else 1
    desired = math.ceil(base * ratio - 1e-9)
    why = f"ceil({base} × {last.pressure:.2f} / {p.target}) = {desired}"
    return Rule("hpa", desired != cur, direction(cur, desired), desired, why)


def checks(samples: tuple[Sample, ...], p: Policy, now: float) -> list[Rule]:
    out = []
    if "seed" in p.checks:
        out.append(seed_check(samples, p, now))
    if "hpa" in p.checks:
        out.append(hpa_check(samples[-1], p))
    return out


def safest(rules: list[Rule], current: int) -> int:
    """Nomad Autoscaler's conflict rule: up > none > down; within one direction, the
    largest count (the most capacity kept)."""
    best = max(rules, key=lambda r: (RANK[r.action], r.desired))
    return best.desired if best.action != NONE else current


def observe(state: State, p: Policy, now: float, pending: int, free: int, current: int) -> State:
    """Add one sample (and the checks' suggestion at it); trim what no rule can read."""
    pr = pressure(pending, free)
    draft = Sample(now, pending, free, current, pr, current)
    samples = (*state.samples, draft)
    suggested = safest(checks(samples, p, now), current)
    samples = (*state.samples, replace(draft, suggested=suggested))
    keep = max(p.up_for_s, p.down_for_s, p.stabilization_s)
    # keep the newest sample older than the window too: it shows a run reaching back
    old = [i for i, s in enumerate(samples) if s.t < now - keep]
    start = old[-1] if old else 0
    samples = samples[start:][-p.history :]
    return replace(state, samples=samples)


def decide(state: State, p: Policy, now: float) -> Decision:
    """The recommendation now, with every check and guard that shaped it."""
    if not state.samples:
        rec = Scale(NONE, 0, 0)
        return Decision(now, 0.0, 0, rec, (Rule("samples", False, NONE, 0, "no sample yet"),))
    last = state.samples[-1]
    cur = last.current
    rules = checks(state.samples, p, now)
    desired = safest(rules, cur)
    if desired < cur and p.stabilization_s > 0:
        window = [s.suggested for s in state.samples if s.t >= now - p.stabilization_s]
        high = min(cur, max([desired, *window]))
        if high > desired:
            why = f"highest suggestion in the last {p.stabilization_s:.0f}s was {high}"
            rules.append(Rule("stabilization", True, direction(cur, high), high, why))
            desired = high
    if desired != cur and state.last_up is not None:
        since = now - state.last_up
        if desired < cur and since < p.cooldown_s:
            why = f"scaled up {since:.0f}s ago; no scale-down for {p.cooldown_s:.0f}s"
            rules.append(Rule("cooldown", True, NONE, cur, why))
            desired = cur
        elif desired > cur and since < p.up_cooldown_s:
            why = f"scaled up {since:.0f}s ago; next scale-up after {p.up_cooldown_s:.0f}s"
            rules.append(Rule("up_cooldown", True, NONE, cur, why))
            desired = cur
    bounded = min(max(desired, p.min_runners), p.max_runners)
    if bounded != desired:
        why = f"{desired} is outside [{p.min_runners}, {p.max_runners}] runners"
        rules.append(Rule("bounds", True, direction(cur, bounded), bounded, why))
        desired = bounded
    rec = Scale(direction(cur, desired), cur, desired)
    effects = (rec,) if rec.action != NONE else ()
    return Decision(now, last.pressure, cur, rec, tuple(rules), effects)


def applied(state: State, scale: Scale, now: float) -> State:
    """An executor carried out `scale`: start the matching cooldown."""
    if scale.action == UP:
        return replace(state, last_up=now)
    if scale.action == DOWN:
        return replace(state, last_down=now)
    return state
