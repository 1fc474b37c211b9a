"""The SERVER that places a repo's tasks: agreed without a vote, stable under churn."""

from __future__ import annotations

import json

import pytest

from kovanex.agent.serverplace import parse_request, request_body
from kovanex.core import scoring
from kovanex.core.servers import placing_server


def test_no_server_alive_means_the_owner_places() -> None:
    assert placing_server("demo", []) is None


def test_every_node_agrees_whatever_order_it_sees_members_in() -> None:
    a = placing_server("demo", ["s1", "s2", "s3"])
    assert a in {"s1", "s2", "s3"}
    assert placing_server("demo", ["s3", "s1", "s2", "s1"]) == a


def test_repos_spread_over_servers_and_only_the_leavers_repos_move() -> None:
    servers = [f"s{i}" for i in range(4)]
    repos = [f"repo-{i}" for i in range(400)]
    before = {r: placing_server(r, servers) for r in repos}
    counts = {s: sum(1 for v in before.values() if v == s) for s in servers}
    assert all(60 < c < 140 for c in counts.values()), counts
    after = {r: placing_server(r, servers[:3]) for r in repos}
    moved = {r for r in repos if after[r] != before[r]}
    assert moved == {r for r in repos if before[r] == "s3"}


def test_place_request_round_trips_and_bad_fields_are_named() -> None:
    req = scoring.TaskRequest(
        task_id="t-1", repo="demo", labels={"gpu": "a100"}, requires=frozenset({"docker"}),
        cpu=0.5, memory_mb=128.0, priority=70,
    )  # fmt: skip
    body = request_body(req, "spread", frozenset({"bad"}))
    got, strategy, excl = parse_request(json.loads(body))
    assert (got, strategy, excl) == (req, "spread", frozenset({"bad"}))
    doc = json.loads(body)
    with pytest.raises(TypeError, match="'cpu'"):
        parse_request({**doc, "cpu": "lots"})
    with pytest.raises(ValueError, match="'strategy'"):
        parse_request({**doc, "strategy": "fastest"})
    with pytest.raises(KeyError, match="'excluded'"):
        parse_request({k: v for k, v in doc.items() if k != "excluded"})
