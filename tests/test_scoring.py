"""Scoring and placement: filters with reasons, factors, strategies, fragmentation."""

from __future__ import annotations

import math

import numpy as np
import pytest

from kovanex.core.scoring import (
    NodeInfo,
    NodeTable,
    Placement,
    TaskRequest,
    Unschedulable,
    fragmentation,
    place,
)
from kovanex.core.strategies import LN10, Strategy, binpack_scalar


def node(name: str, **kw) -> NodeInfo:
    base = dict(
        cpu_total=8.0,
        mem_total_mb=16384.0,
        runners_total=4,
        health=0.9,
        labels={"env": "dev"},
    )
    base.update(kw)
    return NodeInfo(name=name, **base)


def req(**kw) -> TaskRequest:
    base = dict(task_id="t1", repo="app", cpu=1.0, memory_mb=512.0)
    base.update(kw)
    return TaskRequest(**base)


def ok(result: Placement | Unschedulable) -> Placement:
    assert isinstance(result, Placement), result
    return result


def bad(result: Placement | Unschedulable) -> Unschedulable:
    assert isinstance(result, Unschedulable), result
    return result


# --- filters and their reasons ---------------------------------------------------------------


def test_missing_capability_is_named() -> None:
    t = NodeTable([node("a", capabilities=frozenset({"lint"})), node("b")])
    u = bad(place(t, req(requires=frozenset({"sast"}))))
    assert u.reason == "no node provides capability sast" and u.stage == "capability"
    t2 = NodeTable([node("a", capabilities=frozenset({"sast"})), node("b")])
    assert ok(place(t2, req(requires=frozenset({"sast"})))).node == "a"


def test_capabilities_that_exist_only_apart_are_reported_together() -> None:
    t = NodeTable(
        [node("a", capabilities=frozenset({"sast"})), node("b", capabilities=frozenset({"gpu"}))]
    )
    u = bad(place(t, req(requires=frozenset({"sast", "gpu"}))))
    assert u.reason == "no node provides all of capabilities gpu, sast"


def test_missing_label_is_named() -> None:
    t = NodeTable([node("a"), node("b", labels={"env": "staging"})])
    u = bad(place(t, req(labels={"env": "prod"})))
    assert u.reason == "no node has label env=prod" and u.stage == "label"
    t2 = NodeTable([node("a"), node("p", labels={"env": "prod"})])
    assert ok(place(t2, req(labels={"env": "prod"}))).node == "p"


def test_resource_reasons_name_the_shortfall() -> None:
    t = NodeTable([node("a", cpu_total=2.0), node("b", cpu_total=4.0, cpu_used=1.5)])
    u = bad(place(t, req(cpu=4.0)))
    assert u.reason.startswith("no node has 4.0 free cpu") and "2.5" in u.reason
    u = bad(place(t, req(memory_mb=32768.0)))
    assert u.reason.startswith("no node has 32768 MB free memory") and u.stage == "memory"
    full = NodeTable([node("a", runners_total=2, runners_used=2)])
    assert bad(place(full, req())).reason == "no node has a free runner slot"


def test_roles_alive_and_empty() -> None:
    assert bad(place(NodeTable([]), req())).stage == "empty"
    dead = NodeTable([node("a", alive=False)])
    assert bad(place(dead, req())).stage == "alive"
    ctl = NodeTable([node("s", role="SERVER"), node("g", role="STORAGE")])
    assert bad(place(ctl, req())).stage == "role"
    mixed = NodeTable([node("a", role="SERVER", health=1.0), node("b", role="RUNNER", health=0.2)])
    assert ok(place(mixed, req())).node == "b"  # the healthier SERVER runs no tasks


def test_set_alive_invalidates_the_constraint_cache() -> None:
    t = NodeTable([node("a"), node("b")])
    assert ok(place(t, req())).node == "a"
    t.set_alive("a", False)
    assert ok(place(t, req())).node == "b"
    t.set_alive("b", False)
    assert bad(place(t, req())).stage == "alive"


def test_zero_health_never_wins() -> None:
    t = NodeTable([node("a", health=0.0)])
    assert bad(place(t, req())).stage == "health"


# --- factors ---------------------------------------------------------------------------------


def test_locality_factor_owner_replica_remote() -> None:
    t = NodeTable(
        [
            node("a", repos_owned=frozenset({"app"})),
            node("b", repos_replica=frozenset({"app"})),
            node("c"),
        ]
    )
    p = ok(place(t, req(), strategy="spread"))
    got = {p.node: p.breakdown["locality"]} | {n: b["locality"] for n, _, b in p.runners_up}
    assert got == {"a": 1.0, "b": 0.7, "c": 0.3}
    assert p.node == "a"
    assert [n for n, _, _ in p.runners_up] == ["b", "c"]


def test_score_is_the_product_of_the_breakdown() -> None:
    t = NodeTable([node(f"n{i}", health=0.5 + i / 20, cpu_used=float(i)) for i in range(6)])
    for strat in Strategy:
        p = ok(place(t, req(), strategy=strat))
        for _, s, bd in [(p.node, p.score, p.breakdown), *p.runners_up]:
            assert all(0.0 < bd[f] <= 1.0 for f in bd)
            assert s == pytest.approx(math.prod(bd.values()), abs=1e-11)
        assert len(p.runners_up) == 3
        assert p.feasible == 6 and p.strategy == strat.value


def test_preferred_labels_lower_but_do_not_filter() -> None:
    t = NodeTable([node("a", labels={"zone": "eu"}), node("b", labels={"zone": "us"})])
    p = ok(place(t, req(prefer={"zone": "us"}), strategy="spread"))
    assert p.node == "b" and p.breakdown["label_match"] == 1.0
    assert p.runners_up[0][2]["label_match"] == 0.5


# --- strategies ------------------------------------------------------------------------------


def test_best_fit_packs_and_spread_spreads() -> None:
    t = NodeTable(
        [
            node("empty"),
            node("half", cpu_used=4.0, mem_used_mb=8192.0),
            node("full", cpu_used=7.5, mem_used_mb=15000.0),
        ]
    )
    assert ok(place(t, req(), strategy="best-fit")).node == "half"  # "full" cannot fit 1 cpu
    assert ok(place(t, req(cpu=0.5), strategy="best-fit")).node == "full"
    assert ok(place(t, req(), strategy="spread")).node == "empty"


def test_binpack_matches_nomad_endpoints() -> None:
    assert binpack_scalar(0.0, 0.0) == pytest.approx(1.0)  # exactly full: best
    assert binpack_scalar(LN10, LN10) == pytest.approx(0.05)  # empty: the floor, still feasible


def test_locality_strategy_lets_locality_dominate_load() -> None:
    t = NodeTable(
        [
            node("owner", cpu_used=6.0, repos_owned=frozenset({"app"}), health=0.3),
            node("idle", health=1.0),
        ]
    )
    assert ok(place(t, req(), strategy="spread")).node == "idle"
    assert ok(place(t, req(), strategy="locality")).node == "owner"


def test_round_robin_rotates_over_feasible_nodes_by_counter() -> None:
    t = NodeTable([node(n) for n in ("c", "a", "b")] + [node("s", role="SERVER")])
    picks = [ok(place(t, req(), strategy="round-robin", rr_counter=i)).node for i in range(6)]
    assert picks == ["a", "b", "c", "a", "b", "c"]


def test_ties_break_by_name_and_apply_changes_the_next_choice() -> None:
    t = NodeTable([node("b"), node("a"), node("c")])
    r = req()
    first = ok(place(t, r, strategy="spread"))
    assert first.node == "a" and first.score == first.runners_up[0][1]
    before = t.cpu_used.copy()
    place(t, r)
    np.testing.assert_array_equal(t.cpu_used, before)  # place is pure
    t.apply(first.node, r)
    assert ok(place(t, r, strategy="spread")).node == "b"
    assert ok(place(t, r, strategy="best-fit")).node == "a"
    t.release("a", r)
    assert ok(place(t, r, strategy="spread")).node == "a"


def test_strategy_defaults_to_the_request() -> None:
    t = NodeTable([node("empty"), node("busy", cpu_used=5.0)])
    assert ok(place(t, req(strategy="spread"))).node == "empty"
    assert ok(place(t, req(strategy="best-fit"))).node == "busy"


# --- fragmentation ---------------------------------------------------------------------------


def test_fragmentation_counts_free_capacity_too_small_for_any_pending_task() -> None:
    t = NodeTable(
        [
            node("big", cpu_total=8.0, cpu_used=0.0, mem_total_mb=8000.0),
            node("crumb", cpu_total=8.0, cpu_used=7.0, mem_total_mb=8000.0, mem_used_mb=7000.0),
        ]
    )
    assert fragmentation(t, []) == 0.0
    assert fragmentation(t, [req(cpu=1.0, memory_mb=100.0)]) == 0.0
    # A 2-cpu task cannot use the crumb: 1 of 9 free cpu and 1000 of 9000 free MB stranded.
    f = fragmentation(t, [req(cpu=2.0, memory_mb=100.0)])
    assert f == pytest.approx((1 / 9 + 1000 / 9000) / 2)
    # A smaller pending task makes the crumb usable again.
    assert fragmentation(t, [req(cpu=2.0), req(cpu=0.5, memory_mb=10.0)]) == 0.0
