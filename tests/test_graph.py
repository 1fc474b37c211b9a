"""Cluster graph: vertices, env-chain and replication edges, deterministic renderers."""

from __future__ import annotations

import json
import random

from kovanex.core.graph import ClusterGraph, Edge

SEED_MEMBERS = [
    {
        "name": "n1",
        "status": "alive",
        "role": "FULL",
        "labels": {"env": "prod"},
        "capabilities": ["docker"],
        "health": 0.95,
        "runners_used": 3,
        "runners_total": 4,
        "repos_owned": [f"repo{i:02d}" for i in range(12)],
        "repos_replica": [],
    },
    {
        "name": "n2",
        "status": "suspect",
        "role": "RUNNER",
        "labels": {"env": "staging"},
        "health": 0.12,
        "runners": {"used": 0, "total": 2},
        "repos": {"replica": [f"repo{i:02d}" for i in range(12)]},
    },
    {
        "name": "db",
        "role": "storage",
        "labels": {"env": "dev", "zone": "eu"},
        "capabilities": ["sast", "dependency-audit"],
        "health": 0.78,
        "runners_used": 2,
        "runners_total": 2,
        "repos_owned": ["a", "b", "c"],
    },
]


def test_vertices_carry_member_fields_in_both_dict_shapes() -> None:
    g = ClusterGraph.from_members(SEED_MEMBERS)
    assert list(g.vertices) == ["db", "n1", "n2"]
    n2 = g.vertices["n2"]
    assert (n2.runners_used, n2.runners_total, n2.status, n2.role) == (0, 2, "suspect", "RUNNER")
    assert len(n2.repos_replica) == 12 and n2.repos_owned == ()
    db = g.vertices["db"]
    assert db.role == "STORAGE" and db.capabilities == ("dependency-audit", "sast")
    assert g.weight("n1") == 0.95


def test_env_chain_and_replication_edges() -> None:
    g = ClusterGraph.from_members(SEED_MEMBERS)
    env = [(e.src, e.dst) for e in g.edges if e.kind == "env"]
    assert env == [("db", "n2"), ("n2", "n1")]  # dev -> staging -> prod
    rep = [e for e in g.edges if e.kind == "replication"]
    assert len(rep) == 1 and (rep[0].src, rep[0].dst) == ("n1", "n2")
    assert len(rep[0].repos) == 12
    assert g.successors("db", "env") == ["n2"]
    assert g.promotion_path("dev", "prod") == ["dev", "staging", "prod"]
    assert g.promotion_path("prod", "dev") == []


def test_env_edges_connect_every_node_of_adjacent_stages_and_skip_missing_ones() -> None:
    members = [
        {"name": "d1", "labels": {"env": "dev"}},
        {"name": "d2", "labels": {"env": "dev"}},
        {"name": "p1", "labels": {"env": "prod"}},
        {"name": "x", "labels": {}},
    ]
    g = ClusterGraph.from_members(members)
    assert [(e.src, e.dst) for e in g.edges] == [("d1", "p1"), ("d2", "p1")]
    assert g.envs_present() == ["dev", "prod"]


def test_replication_edges_group_repos_per_pair_and_ignore_self_and_orphans() -> None:
    members = [
        {"name": "a", "repos_owned": ["r1", "r2"], "repos_replica": ["r3"]},
        {"name": "b", "repos_replica": ["r1", "r2", "orphan"]},
        {"name": "c", "repos_owned": ["r3"], "repos_replica": ["r3", "r1"]},
    ]
    g = ClusterGraph.from_members(members)
    assert g.edges == [
        Edge("replication", "a", "b", ("r1", "r2")),
        Edge("replication", "a", "c", ("r1",)),
        Edge("replication", "c", "a", ("r3",)),
    ]


def test_text_resembles_the_seed_picture() -> None:
    text = ClusterGraph.from_members(SEED_MEMBERS).to_text()
    lines = text.splitlines()
    # prod, staging, dev left to right, as in the seed
    assert lines[0].split() == [
        "labels:",
        "prod",
        "labels:",
        "staging",
        "labels:",
        "dev,",
        "zone=eu",
    ]
    assert "repos: 12" in lines[1] and "repos: 12 (replica)" in lines[1] and "repos: 3" in lines[1]
    assert lines[2].split() == ["runners:", "3/4", "runners:", "0/2", "runners:", "2/2"]
    health = lines[5]
    assert (
        health.index("[n1: 0.95]") < health.index("[n2: 0.12] SUSPECT") < health.index("[db: 0.78]")
    )
    assert "environments: dev -> staging -> prod" in text
    assert "n1 -> n2: repo00, repo01, repo02, repo03, repo04 (+7 more)" in text


def test_text_wraps_wide_clusters() -> None:
    members = [{"name": f"node-{i:02d}", "health": i / 20} for i in range(20)]
    text = ClusterGraph.from_members(members).to_text(width=80)
    assert all(len(line) <= 80 for line in text.splitlines())
    assert all(f"[node-{i:02d}: {i / 20:.2f}]" in text for i in range(20))


def test_json_and_dot_are_valid_and_complete() -> None:
    g = ClusterGraph.from_members(SEED_MEMBERS)
    data = json.loads(g.to_json())
    assert [v["name"] for v in data["vertices"]] == ["db", "n1", "n2"]
    assert data["vertices"][2]["runners"] == {"used": 0, "total": 2}
    assert {e["kind"] for e in data["edges"]} == {"env", "replication"}
    dot = g.to_dot()
    assert dot.startswith("digraph cluster {") and dot.rstrip().endswith("}")
    assert '"db" -> "n2" [label="promote", style=bold];' in dot
    assert '"n1" -> "n2" [label="12 repos", style=dashed];' in dot
    assert '[label="n2\\nstaging\\n0.12\\nRUNNER", style=dashed]' in dot


def test_dot_escapes_quotes_in_names() -> None:
    dot = ClusterGraph.from_members([{"name": 'we"ird'}]).to_dot()
    assert '"we\\"ird"' in dot


def test_output_is_deterministic_regardless_of_member_order() -> None:
    base = ClusterGraph.from_members(SEED_MEMBERS)
    for seed in range(5):
        shuffled = list(SEED_MEMBERS)
        random.Random(seed).shuffle(shuffled)
        g = ClusterGraph.from_members(shuffled)
        assert (g.to_json(), g.to_dot(), g.to_text()) == (
            base.to_json(),
            base.to_dot(),
            base.to_text(),
        )


def test_health_is_clamped_and_missing_fields_default() -> None:
    g = ClusterGraph.from_members([{"name": "z", "health": 7}, {"name": "y", "health": None}])
    assert g.weight("z") == 1.0 and g.weight("y") == 0.0
    assert g.vertices["y"].status == "alive" and g.edges == []
