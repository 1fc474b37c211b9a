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


class _SamePortTwice:
    """A generator that offers the same port first for gossip and again for HTTP."""

    def __init__(self, ports: list[int]) -> None:
        self.ports = ports

    def randrange(self, lo: int, hi: int) -> int:
        return self.ports.pop(0) if self.ports else lo


def test_http_port_is_never_the_gossip_port(tmp_path: Path, monkeypatch) -> None:
    import kovanex.cli.nodecmd as nodecmd
    from kovanex.cli.main import main

    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    a, b = _free_port("127.0.0.1"), _free_port("127.0.0.1", avoid=frozenset())
    while b == a:
        b = _free_port("127.0.0.1")
    seq = [a, a, b]  # gossip takes a; HTTP is offered a again (collision), then b
    monkeypatch.setattr(nodecmd.random, "Random", lambda: _SamePortTwice(seq))
    monkeypatch.setattr(nodecmd, "_reserve", lambda port: True)  # the avoid rule alone
    data = tmp_path / "n1"
    assert main(["--data", str(data), "init", "--name", "n1", "--bind", "127.0.0.1:0"]) == 0
    text = (data / "kovanex.toml").read_text()
    assert f'"127.0.0.1:{a}"' in text and f'"127.0.0.1:{b}"' in text
    assert a < low and b < low


def test_a_port_picked_by_one_init_is_not_offered_to_the_next(tmp_path: Path, monkeypatch) -> None:
    import tempfile

    import kovanex.cli.nodecmd as nodecmd

    a = _free_port("127.0.0.1")
    b = _free_port("127.0.0.1")
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # a fresh reservation dir
    monkeypatch.setattr(nodecmd.random, "Random", lambda: _SamePortTwice([a, a, b]))
    assert _free_port("127.0.0.1") == a
    assert _free_port("127.0.0.1") == b  # a is still reserved by the first pick
