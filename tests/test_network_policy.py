"""Issue 22 part 4: a unit's network policy, tried as pushed steps would try it.

A step probes the node's own service ports (NATS client, route and monitor, the hook
port, gossip over TCP and UDP) and must be refused, while the node's HTTP API answers;
`egress = "none"` closes a listener the test opens on another loopback port, and an
allow list opens only its entry. The rules are nftables rules on the units' uids, in a
table of the node's own that its stop removes (ADR 0076)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
from pathlib import Path

import pytest

from kovanex import config as cfgmod
from kovanex.core import netpolicy as core
from kovanex.runner import netpolicy
from kovanex.runner import units as unitsmod
from tests.agentkit import Node, clone_with_task, ended, exchange_dir, git, wait_for

pytestmark = [
    pytest.mark.skipif(
        os.geteuid() != 0, reason="units and nftables need root (useradd, nft); CI runs as root"
    ),
    pytest.mark.skipif(
        netpolicy.nft_binary() is None,
        reason="no nft on this host: `make test` as root installs nftables",
    ),
]

# The step's probe: connect (TCP) or send (UDP) to each target, write what happened.
PROBE = """
import json, socket, sys
out, results = sys.argv[1], {}
for target in sys.argv[2:]:
    name, proto, port = target.split(":")
    try:
        if proto == "tcp":
            socket.create_connection(("127.0.0.1", int(port)), timeout=10).close()
        else:
            s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            s.connect(("127.0.0.1", int(port)))
            s.send(b"probe")
            s.close()
        results[name] = "connected"
    except OSError as e:
        results[name] = type(e).__name__
with open(out, "w") as f:
    json.dump(results, f)
"""


def _cfg(node: Node) -> cfgmod.NodeConfig:
    return cfgmod.load(cfgmod.Layout(node.data))


def _http_port(node: Node) -> int:
    return cfgmod.parse_addr(_cfg(node).http_bind, 0)[1]


def _gossip_port(node: Node) -> int:
    return cfgmod.parse_addr(_cfg(node).gossip_bind)[1]


def _hook_port(node: Node) -> int:
    return int((node.data / "run" / "hook").read_text().split()[0])


def _table(node: Node) -> str:
    return core.table_name(unitsmod.unit_key(_cfg(node)))


def _tables() -> str:
    return subprocess.run(["nft", "list", "tables"], capture_output=True, text=True).stdout


def _probe(node: Node, tmp_path: Path, task: str, targets: list[str]) -> dict[str, str]:
    """Push a task whose step probes `targets` (name:proto:port) as its unit; its answers."""
    out = exchange_dir() / "probe.json"
    spec = f"""
[[steps]]
name = "probe"
run = "/usr/bin/python3 probe.py {out} {" ".join(targets)}"
timeout_s = 90
"""
    clone = clone_with_task(node, "demo", tmp_path / "c", task, spec, {"probe.py": PROBE})
    git("push", "-q", "origin", f"task/{task}", cwd=clone)
    wait_for(lambda: ended(node, task), 120, f"{task} to end")
    assert out.exists(), node.kx("task", "logs", task, check=False).stdout
    return json.loads(out.read_text())


def _connects(port: int, proto: str = "tcp") -> bool:
    """The test's own process (root, not a unit) reaches the port."""
    if proto == "udp":
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.connect(("127.0.0.1", port))
        s.send(b"x")  # a rule on our uid would fail this with EPERM
        s.close()
        return True
    socket.create_connection(("127.0.0.1", port), timeout=10).close()
    return True


def _listener() -> socket.socket:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(8)
    return s


def test_a_step_cannot_reach_the_node_ports_but_reaches_its_api(tmp_path: Path) -> None:
    node = Node(tmp_path, "np1", "--runners", "1", "--profile", "local", "--coordination", "nats")
    co = _cfg(node).coordination
    node.start()
    try:
        nats = {"nats-client": co.client_port, "nats-route": co.cluster_port}
        wait_for(lambda: _connects(co.client_port), 30, "nats-server to listen")
        ports = {**nats, "hook": _hook_port(node), "gossip-tcp": _gossip_port(node)}
        targets = [f"{k}:tcp:{p}" for k, p in ports.items()]
        targets += [f"gossip-udp:udp:{_gossip_port(node)}", f"api:tcp:{_http_port(node)}"]
        got = _probe(node, tmp_path, "ports", targets)
        assert got["api"] == "connected", got
        reached = {k: v for k, v in got.items() if k != "api" and v == "connected"}
        assert not reached, f"a step reached the node's own ports: {got}"
        # the rules match the units' uids only: this test's own process still connects
        for name, port in ports.items():
            if name != "nats-route":  # a lone server listens on no route port (ADR 0080)
                assert _connects(port), name
        assert _connects(_gossip_port(node), "udp")
        st = node.kx("status").stdout
        assert "network node ports blocked for units" in st and "egress all" in st, st
        assert "nats client" in st and "hook" in st and "gossip" in st, st
        units = json.loads(node.kx("units", "--format", "json").stdout)
        assert units["network"].startswith("node ports blocked"), units
        # a crash leaves the table; the next start replaces it, the next stop removes it
        assert _table(node) in _tables()
        node.kill9()
        assert _table(node) in _tables()
        node.start()
        wait_for(
            lambda: "network node ports blocked" in node.kx("status", check=False).stdout,
            60,
            "the restarted agent to put its rules back",
        )
    finally:
        node.stop()
    assert _table(node) not in _tables(), "the agent's stop left its nftables table"


def test_egress_none_closes_every_other_port_but_the_api(tmp_path: Path) -> None:
    node = Node(tmp_path, "np2", "--runners", "1", "--profile", "local")
    layout = cfgmod.Layout(node.data)
    cfg = cfgmod.load(layout)
    cfg.units_egress = "none"
    cfgmod.save(layout, cfg)
    other = _listener()
    try:
        node.start()
        port = other.getsockname()[1]
        got = _probe(node, tmp_path, "none", [f"other:tcp:{port}", f"api:tcp:{_http_port(node)}"])
        assert got == {"other": "ConnectionRefusedError", "api": "connected"}, got
        assert _connects(port)  # not this test's own uid
        assert "egress none" in node.kx("status").stdout
    finally:
        node.stop()
        other.close()
    assert _table(node) not in _tables()


def test_an_allow_list_opens_only_its_entry(tmp_path: Path) -> None:
    node = Node(tmp_path, "np3", "--runners", "1", "--profile", "local")
    allowed, refused = _listener(), _listener()
    a, r = allowed.getsockname()[1], refused.getsockname()[1]
    layout = cfgmod.Layout(node.data)
    cfg = cfgmod.load(layout)
    cfg.units_egress = [f"127.0.0.1:{a}"]
    cfgmod.save(layout, cfg)
    try:
        node.start()
        got = _probe(node, tmp_path, "allow", [f"allowed:tcp:{a}", f"refused:tcp:{r}"])
        assert got == {"allowed": "connected", "refused": "ConnectionRefusedError"}, got
        assert f"egress allow 127.0.0.1:{a}" in node.kx("status").stdout
    finally:
        node.stop()
        allowed.close()
        refused.close()
