"""`[coordination]` settings, `kovanex init --coordination nats`, and the push-time refusal of
absolute_consistency on the gossip backend (issue 12 parts 1 and 4)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kovanex import config as cfgmod
from kovanex.coordcfg import CoordinationConfig
from tests.agentkit import Node, clone_with_task, git, kx

SPEC = """
failover = "absolute_consistency"
[[steps]]
name = "pay"
run = "echo paid"
"""


def _load(table: str) -> cfgmod.NodeConfig:
    return cfgmod.NodeConfig.from_toml(f'[node]\nname = "n1"\n[coordination]\n{table}\n')


@pytest.mark.parametrize(
    ("table", "msg"),
    [
        ('backend = "raft"', "backend 'raft' must be gossip or nats"),
        ('backend = "nats"', "client_port is not set; `kovanex init --coordination nats`"),
        ("lease_ttl_s = 1.0\nrenew_interval_s = 0.8", "at most half of lease_ttl_s"),
        ("lease_ttl_s = -1.0", "must be positive"),
        ("client_port = 70000", "client_port = 70000 must be a port"),
        ("client_port = 5000\ncluster_port = 5000", "ports must differ"),
        ('lease_ttl_s = "3"', "lease_ttl_s = '3' must be a float"),
        ("election_timeout_ms = 2000", "unknown key(s) election_timeout_ms"),
        ('failover_default = "absolute_consistency"', "gossip backend cannot give"),
    ],
)
def test_coordination_settings_are_validated_with_a_clear_error(table: str, msg: str) -> None:
    with pytest.raises(cfgmod.ConfigError, match="coordination") as e:
        _load(table)
    assert msg in str(e.value)


def test_the_table_round_trips_and_gossip_writes_nothing() -> None:
    c = cfgmod.NodeConfig("n1")
    assert "[coordination]" not in c.to_toml()
    c.coordination = CoordinationConfig("nats", 4301, 4302, lease_ttl_s=4.0)
    back = cfgmod.NodeConfig.from_toml(c.to_toml())
    assert back.coordination == c.coordination
    assert back.coordination.lease().ttl_s == 4.0


def test_a_cluster_name_with_quotes_and_backslashes_round_trips() -> None:
    """repr() with its quotes swapped wrote `"it"s"` for `it's`: a file that no longer loads."""
    c = cfgmod.NodeConfig("n1")
    c.coordination = CoordinationConfig("nats", 4301, 4302, cluster_name='it\'s "a" \\ b')
    back = cfgmod.NodeConfig.from_toml(c.to_toml())
    assert back.coordination == c.coordination


def test_init_with_nats_records_free_distinct_ports(tmp_path: Path) -> None:
    kx(
        "init",
        "--name",
        "a",
        "--bind",
        "127.0.0.1:0",
        "--coordination",
        "nats",
        data=tmp_path / "a",
    )
    kx(
        "init",
        "--name",
        "b",
        "--bind",
        "127.0.0.1:0",
        "--coordination",
        "nats",
        data=tmp_path / "b",
    )
    ca = cfgmod.load(cfgmod.Layout(tmp_path / "a")).coordination
    cb = cfgmod.load(cfgmod.Layout(tmp_path / "b")).coordination
    ports = [ca.client_port, ca.cluster_port, cb.client_port, cb.cluster_port]
    assert ca.backend == cb.backend == "nats"
    assert len(set(ports)) == 4 and all(1024 <= p < 65536 for p in ports)


def test_absolute_consistency_is_refused_at_push_time_on_gossip(tmp_path: Path) -> None:
    n = Node(tmp_path, "n1").start()
    try:
        clone = clone_with_task(n, "bank", tmp_path / "c", "pay-1", SPEC)
        p = git("push", "origin", "task/pay-1", cwd=clone, check=False)
        assert p.returncode != 0
        assert 'failover = "absolute_consistency" needs a quorum' in p.stderr
        assert "kovanex init --coordination nats" in p.stderr  # the fix
        assert 'failover = "split_brain_allowed"' in p.stderr  # the other fix
        refs = git("show-ref", "task/pay-1", cwd=n.repo("bank"), check=False)
        assert refs.returncode != 0  # nothing written
        # the same task asking for split_brain_allowed is accepted
        spec = SPEC.replace("absolute_consistency", "split_brain_allowed")
        clone_with_task(n, "bank", clone, "pay-2", spec)
        assert "accepted" in git("push", "origin", "task/pay-2", cwd=clone).stderr
    finally:
        n.stop()
