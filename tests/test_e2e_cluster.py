"""Issue 3 with real agents on loopback: join, kill -9, declared dead everywhere,
restart and rejoin, and a gossip key rotated mid-run with nobody declared dead.

Four agents, not eight: every step still needs gossip to spread through nodes that are
neither its source nor its target (the victim's death reaches three observers, a
capability travels from kc1 to kc3), and the eight-process run of the same story
(tests/test_gossip_process.py) covers the larger cluster."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.agentkit import Node, kx, wait_for

N = 4  # names kc0..kc3: unique on a shared host (the units lock keys on them)


def statuses(node: Node) -> dict[str, str]:
    out = node.kx("members", "--format", "json").stdout
    return {m["name"]: m["status"] for m in json.loads(out)}


@pytest.mark.slow
def test_agents_join_fail_rejoin_and_rotate_keys(tmp_path: Path) -> None:
    k1 = kx("keygen").stdout.strip()
    k2 = kx("keygen").stdout.strip()
    nodes = [
        Node(tmp_path, f"kc{i}", "--profile", "local", "--encrypt", k1, "--labels", f"idx={i}")
        for i in range(N)
    ]
    seed = nodes[0]
    bind = (seed.data / "kovanex.toml").read_text().split('bind = "')[1].split('"')[0]
    try:
        seed.start()
        for n in nodes[1:]:
            n.start("--join", bind)
        names = {n.name for n in nodes}

        def all_alive(observers: list[Node], expect: set[str]) -> bool:
            return all(
                {k for k, v in statuses(o).items() if v == "alive"} >= expect for o in observers
            )

        wait_for(lambda: all_alive(nodes, names), 60, f"all {N} agents to see each other alive")
        only = json.loads(seed.kx("members", "--label", "idx=3", "--format", "json").stdout)
        assert [m["name"] for m in only] == ["kc3"]

        victim = nodes[2]
        victim.kill9()
        others = [n for n in nodes if n is not victim]
        wait_for(
            lambda: all(statuses(o).get(victim.name) == "dead" for o in others),
            60,
            "the victim declared dead on every node",
        )
        victim.start()  # same name, new gossip port is fine; here the same port is reused
        wait_for(lambda: all_alive(nodes, names), 60, "the victim to rejoin as alive everywhere")

        # rotate the gossip key: install everywhere, use everywhere, remove the old one
        for step in (("--install", k2), ("--use", k2), ("--remove", k1)):
            for n in nodes:
                n.kx("keys", *step)
        keys = json.loads(seed.kx("keys", "--list", "--format", "json").stdout)
        assert keys["keys"] == [k2] and keys["primary"] == k2
        # gossip still flows under the new key: a fresh meta change propagates ...
        nodes[1].kx(
            "module",
            "register",
            "--name",
            "scan",
            "--version",
            "1.0",
            "--endpoint",
            "127.0.0.1:9100",
            "--provides",
            "sast",
        )

        def sees_cap() -> bool:
            ms = json.loads(nodes[3].kx("members", "--format", "json").stdout)
            return "sast" in next(m for m in ms if m["name"] == "kc1")["capabilities"]

        wait_for(sees_cap, 30, "a capability published after rotation to reach kc3")
        # ... and nobody was declared failed during the rotation
        assert all_alive(nodes, names)
        events = seed.kx("monitor", "--count", "1", "--since", "0", "--format", "json").stdout
        assert events  # monitor streams events as JSON lines
    finally:
        for n in nodes:
            n.stop()
