"""`[units] egress` and the rules it becomes (kovanex/core/netpolicy.py, ADR 0076), and
the loud line of an agent that cannot enforce a network policy."""

from __future__ import annotations

from pathlib import Path

import pytest

from kovanex import config as cfgmod
from kovanex.core import netpolicy as core
from tests.agentkit import Node


def test_egress_forms_parse_and_print_back() -> None:
    assert core.parse_egress("all") == core.Egress("all")
    assert core.parse_egress("none").text() == "none"
    e = core.parse_egress(["10.0.0.0/8", "192.0.2.7:443", "[2001:db8::/32]:53", "::1"])
    assert e.text() == "allow 10.0.0.0/8, 192.0.2.7:443, [2001:db8::/32]:53, ::1"
    assert core.parse_egress(eval(e.toml())) == e  # the TOML list reads back the same


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("some", 'must be "all", "none" or a list'),
        (7, 'must be "all", "none" or a list'),
        (["10.0.0.1", "example.com:443"], "egress[1] = 'example.com:443' is not an address"),
        (["10.0.0.1:0"], "egress[0] = '10.0.0.1:0': the port must be 1-65535"),
        (["[::1]:x"], "egress[0] = '[::1]:x': the port must be 1-65535"),
        ([3], "egress[0] = 3 must be a string"),
        (["1.2.3.4"] * 300, "at most 256"),
    ],
)
def test_a_bad_egress_is_refused_naming_the_entry(value: object, says: str) -> None:
    with pytest.raises(ValueError, match=None) as e:
        core.parse_egress(value)
    assert says in str(e.value)


def test_kovanex_toml_refuses_a_host_name_with_the_field(tmp_path: Path) -> None:
    layout = cfgmod.Layout(tmp_path)
    cfgmod.save(layout, cfgmod.NodeConfig(name="n1"))
    text = layout.config.read_text().replace('egress = "all"', 'egress = ["db.internal:5432"]')
    layout.config.write_text(text)
    with pytest.raises(cfgmod.ConfigError, match=r"\[units\] egress\[0\].*host names"):
        cfgmod.load(layout)


def test_the_node_ports_are_nats_hook_and_gossip_once_bound() -> None:
    ports = core.node_ports((4222, 6222), 7001, 7946, 8080)
    assert ports == core.NodePorts(
        (("nats client", 4222), ("nats route", 6222), ("hook", 7001), ("gossip", 7946)),
        (("gossip", 7946),),
        8080,
    )
    assert core.node_ports(None, 0, 0, 8080) == core.NodePorts((), (), 8080)  # nothing bound


def test_the_rules_close_node_ports_to_the_units_uids_only() -> None:
    ports = core.NodePorts((("nats client", 4222), ("gossip", 7946)), (("gossip", 7946),), 8080)
    all_ = core.render("kovanex-n1-abc123", [61001, 61000], ports, core.Egress())
    assert "add table inet kovanex-n1-abc123\ndelete table inet kovanex-n1-abc123" in all_
    assert "meta skuid { 61000, 61001 } jump unit" in all_
    assert 'oif "lo" tcp dport { 4222, 7946 } reject with tcp reset' in all_
    assert 'oif "lo" udp dport { 7946 } reject' in all_
    assert "accept" not in all_.split("chain unit")[1]  # egress all: nothing else is touched
    none = core.render("t", [61000], ports, core.parse_egress("none"))
    unit = none.split("chain unit")[1]
    assert unit.index("dport { 4222, 7946 } reject") < unit.index("dport 8080 accept")
    assert unit.rstrip().endswith("reject\n  }\n}".rstrip())
    allow = core.render("t", [61000], ports, core.parse_egress(["10.0.0.0/8", "[::1]:53"]))
    assert "ip daddr 10.0.0.0/8 accept" in allow
    assert "ip6 daddr ::1/128 meta l4proto { tcp, udp } th dport 53 accept" in allow
    assert ports.text() == "nats client 4222, gossip 7946/tcp+udp"


def test_table_names_are_the_unit_key_made_safe() -> None:
    assert core.table_name("n1-3fa9c1") == "kovanex-n1-3fa9c1"
    odd = core.table_name("n.1-3fa9c1")
    assert odd.startswith("kovanex-n_1-3fa9c1_") and odd != core.table_name("n_1-3fa9c1")


def test_an_agent_whose_steps_run_as_itself_says_the_policy_is_not_enforced(
    tmp_path: Path,
) -> None:
    node = Node(tmp_path, "npn", "--units", "none", "--runners", "1", "--profile", "local")
    try:
        node.start()
        out = node.kx("status").stdout
        assert "network NOT enforced: units can reach the node's ports" in out, out
        assert "egress all NOT enforced" in out, out
        assert "network: NOT enforced" in node.log()  # the agent log warns too
    finally:
        node.stop()
