"""numpy `place` and plain-Python `place_plain` agree, placement after placement."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kovanex.core.scoring import (
    NodeInfo,
    NodeTable,
    Placement,
    TaskRequest,
    Unschedulable,
    apply_plain,
    place,
    place_plain,
)
from kovanex.core.strategies import QUANTUM, ROLES, Strategy

REPOS = ["api", "web", "infra", "ml", "docs"]
CAPS = ["sast", "gpu", "docker", "dependency-audit"]
ENVS = ["dev", "staging", "prod"]


def random_nodes(rng: random.Random, n: int) -> list[NodeInfo]:
    out = []
    for i in range(n):
        cpu = float(rng.choice([2, 4, 8, 16]))
        mem = float(rng.choice([2048, 4096, 8192, 16384]))
        runners = rng.randrange(0, 5)
        out.append(
            NodeInfo(
                name=f"n{rng.randrange(10_000):04d}-{i}",
                role=rng.choice(ROLES + ("FULL", "RUNNER")),
                labels={"env": rng.choice(ENVS), "zone": rng.choice(["eu", "us"])},
                capabilities=frozenset(rng.sample(CAPS, rng.randrange(0, 3))),
                health=rng.choice([0.0, 0.5, 0.9, 1.0, rng.random()]),
                cpu_total=cpu,
                cpu_used=round(rng.uniform(0, cpu), 1),
                mem_total_mb=mem,
                mem_used_mb=float(rng.randrange(0, int(mem))),
                runners_total=runners,
                runners_used=rng.randrange(0, runners + 1),
                repos_owned=frozenset(rng.sample(REPOS, rng.randrange(0, 2))),
                repos_replica=frozenset(rng.sample(REPOS, rng.randrange(0, 3))),
                alive=rng.random() > 0.1,
            )
        )
    return out


def random_request(rng: random.Random, i: int) -> TaskRequest:
    labels = {"env": rng.choice(ENVS)} if rng.random() < 0.3 else {}
    prefer = {"zone": rng.choice(["eu", "us"])} if rng.random() < 0.3 else {}
    return TaskRequest(
        task_id=f"t{i}",
        repo=rng.choice(REPOS),
        labels=labels,
        requires=frozenset(rng.sample(CAPS, 1)) if rng.random() < 0.2 else frozenset(),
        cpu=rng.choice([0.25, 0.5, 1.0, 2.0, 4.0]),
        memory_mb=float(rng.choice([0, 256, 1024, 4096])),
        strategy=rng.choice(list(Strategy)).value,
        prefer=prefer,
    )


def assert_same(a: Placement | Unschedulable, b: Placement | Unschedulable) -> None:
    assert type(a) is type(b), (a, b)
    if isinstance(a, Unschedulable):
        assert (a.reason, a.stage) == (b.reason, b.stage)
        return
    assert a.node == b.node
    assert abs(a.score - b.score) <= QUANTUM
    assert [n for n, _, _ in a.runners_up] == [n for n, _, _ in b.runners_up]
    for fa, fb in zip(a.breakdown.values(), b.breakdown.values(), strict=True):
        assert fa == pytest.approx(fb, rel=1e-12)
    assert (a.feasible, a.strategy) == (b.feasible, b.strategy)


def feasible(n: NodeInfo, r: TaskRequest) -> bool:
    """The hard filters, written out independently of both implementations."""
    return (
        n.alive
        and n.role in ("FULL", "RUNNER")
        and set(r.requires) <= set(n.capabilities)
        and all(n.labels.get(k) == v for k, v in r.labels.items())
        and n.cpu_total - n.cpu_used >= r.cpu - 1e-9
        and n.mem_total_mb - n.mem_used_mb >= r.memory_mb - 1e-9
        and n.runners_used < n.runners_total
        and n.health > 0
    )


def check_invariants(nodes: list[NodeInfo], r: TaskRequest, res: Placement | Unschedulable) -> None:
    by_name = {n.name: n for n in nodes}
    ok = [n for n in nodes if feasible(n, r)]
    if isinstance(res, Unschedulable):
        assert ok == [], res
        return
    assert feasible(by_name[res.node], r)
    assert res.feasible == len(ok)
    assert 0.0 < res.score <= 1.0
    for name, score, _ in res.runners_up:
        assert feasible(by_name[name], r) and name != res.node
        if res.strategy != Strategy.ROUND_ROBIN:
            assert score <= res.score
    if res.strategy != Strategy.ROUND_ROBIN and len(ok) > 1:
        assert len(res.runners_up) == min(3, len(ok) - 1)


def run_lockstep(seed: int, n_nodes: int, n_tasks: int) -> int:
    rng = random.Random(seed)
    nodes = random_nodes(rng, n_nodes)
    table = NodeTable(nodes)
    plain = table.to_nodes()  # name-sorted, same order as the table
    placed = 0
    for i in range(n_tasks):
        r = random_request(rng, i)
        rr = rng.randrange(0, 50)
        a = place(table, r, rr_counter=rr)
        b = place_plain(plain, r, rr_counter=rr)
        assert_same(a, b)
        check_invariants(plain, r, a)
        if isinstance(a, Placement):
            table.apply(a.node, r)
            apply_plain(plain, table.index[a.node], r)
            placed += 1
    assert table.to_nodes() == plain
    return placed


@pytest.mark.parametrize("seed", range(1, 9))
def test_numpy_and_plain_agree_over_a_sequence(seed: int) -> None:
    placed = run_lockstep(seed, n_nodes=40, n_tasks=120)
    assert placed > 0


@pytest.mark.parametrize("seed", [11, 12])
def test_agree_on_a_large_cluster_with_many_ties(seed: int) -> None:
    """A large cluster with many equal nodes: quantised ties must resolve identically."""
    placed = run_lockstep(seed, n_nodes=2500, n_tasks=30)
    assert placed > 0


def test_top4_prefers_lower_index_among_quantised_ties() -> None:
    import numpy as np

    from kovanex.core.scoring import _top4

    score = np.zeros(3000)
    score[[2900, 10, 1500, 640, 3]] = 0.5  # five-way tie: the lowest indices win
    score[2999] = 0.9
    assert _top4(score) == [2999, 3, 10, 640]
    score[10] = 0.5 + QUANTUM / 4  # below one quantum: still a tie, index decides
    before = score.copy()
    assert _top4(score) == [2999, 3, 10, 640]
    np.testing.assert_array_equal(score, before)  # the scratch vector is restored
    score[1500] = 0.5 + 2 * QUANTUM  # a whole quantum better: beats the lower indices
    assert _top4(score) == [2999, 1500, 3, 10]
    assert _top4(np.zeros(3000)) == []


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32), n_nodes=st.integers(0, 12))
def test_numpy_and_plain_agree_on_small_random_clusters(seed: int, n_nodes: int) -> None:
    run_lockstep(seed, n_nodes=n_nodes, n_tasks=15)


def test_lockstep_exercises_every_outcome() -> None:
    """Guard against a generator that never produces the interesting cases."""
    rng = random.Random(7)
    stages: set[str] = set()
    strategies: set[str] = set()
    for seed in range(30):
        nodes = random_nodes(random.Random(seed), 8)
        table = NodeTable(nodes)
        for i in range(20):
            res = place(table, random_request(rng, i))
            if isinstance(res, Unschedulable):
                stages.add(res.stage)
            else:
                strategies.add(res.strategy)
    assert {"capability", "label", "cpu", "runner"} <= stages
    assert strategies == {s.value for s in Strategy}
