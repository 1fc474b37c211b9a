"""The placement benchmark stays runnable and keeps numpy and plain Python in agreement."""

from __future__ import annotations

from bench.placement import quality, synth_nodes, throughput
from kovanex.core.strategies import Strategy


def test_throughput_smoke_run_agrees_and_reports_rates() -> None:
    r = throughput(n_nodes=300, n_tasks=300, plain_tasks=60)  # raises if picks differ
    assert r["plain_tasks"] == 60 and r["tasks"] == 300
    assert r["np_cpu_rate"] > 0 and r["pl_cpu_rate"] > 0
    assert r["np_p50_us"] <= r["np_p95_us"]


def test_quality_orders_strategies_sensibly() -> None:
    by = {s: quality(200, 400, s) for s in Strategy}
    assert all(q["placed"] == 400 for q in by.values())
    # bin-packing uses the fewest nodes, round-robin the most
    assert by[Strategy.BEST_FIT]["nodes_used"] < by[Strategy.SPREAD]["nodes_used"]
    assert by[Strategy.SPREAD]["nodes_used"] < by[Strategy.ROUND_ROBIN]["nodes_used"]
    # the locality strategy lands on owners more than anyone else
    assert by[Strategy.LOCALITY]["owner_rate"] > by[Strategy.SPREAD]["owner_rate"]
    assert by[Strategy.LOCALITY]["owner_rate"] > by[Strategy.BEST_FIT]["owner_rate"]
    assert 0.0 <= by[Strategy.BEST_FIT]["fragmentation"] <= 1.0


def test_synthetic_fleet_is_deterministic() -> None:
    assert synth_nodes(50, 7) == synth_nodes(50, 7)
