"""`kovanex init` records ports that a client's outgoing connection cannot take later,
and the agent explains a taken address instead of printing a traceback."""

from __future__ import annotations

import socket
from pathlib import Path

from kovanex.cli.nodecmd import _free_port
from tests.agentkit import kx


def test_recorded_ports_sit_below_the_ephemeral_range_and_are_free_for_tcp_and_udp() -> None:
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    for _ in range(20):
        port = _free_port("127.0.0.1")
        assert 1024 <= port < low
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as t:
            t.bind(("127.0.0.1", port))
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as u:
            u.bind(("127.0.0.1", port))


def test_agent_on_a_taken_address_says_what_to_do(tmp_path: Path) -> None:
    data = tmp_path / "n1"
    kx("init", "--name", "n1", "--bind", "127.0.0.1:0", data=data)
    port = int((data / "kovanex.toml").read_text().split('bind = "127.0.0.1:')[1].split('"')[0])
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as squatter:
        squatter.bind(("127.0.0.1", port))
        squatter.listen()
        p = kx("agent", data=data, check=False)
    assert p.returncode == 1
    assert "kovanex init --force" in p.stderr and "Traceback" not in p.stderr
