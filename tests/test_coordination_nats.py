"""Issue 12 with real agents and real nats-server children on loopback: one leader, the same
term everywhere, a new leader at a higher term after `kill -9`, and `cluster status` on
the gossip backend."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path

import pytest

from kovanex import config as cfgmod
from kovanex import natsauth
from kovanex.agent.coordination.natsserver import nats_binary
from tests.agentkit import Node, process_gone, wait_for

TOKEN = "t0ken-for-tests"


def gossip_addr(n: Node) -> str:
    return (n.data / "kovanex.toml").read_text().split('bind = "')[1].split('"')[0]


def status(n: Node) -> dict:
    return json.loads(n.kx("cluster", "status", "--format", "json").stdout)


def leader_term_metric(n: Node) -> int | None:
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    url = "http://" + (n.data / "kovanex.toml").read_text().split("[http]")[1].split('"')[1]
    with urllib.request.urlopen(url + "/metrics", timeout=30) as r:
        text = r.read().decode()
    for fam in text_string_to_metric_families(text):
        if fam.name == "kovanex_leader_term":
            return int(fam.samples[0].value)
    return None


def nats_cluster(tmp_path: Path, count: int = 3) -> list[Node]:
    nodes = [
        Node(tmp_path, f"c{i}", "--profile", "local", "--token", TOKEN, "--coordination", "nats")
        for i in range(count)
    ]
    nodes[0].start()
    for n in nodes[1:]:
        n.start("--join", gossip_addr(nodes[0]))
    return nodes


def agreed(nodes: list[Node], look: Callable[[Node], dict] = status) -> tuple[str, int] | None:
    """The (leader, term) every node reports, or None while they disagree. `look` reads
    one node's `cluster status` (the CLI by default; the partition tests poll the same op
    through the control socket, which is much cheaper on a loaded host)."""
    seen = {(s["leader"], s["term"]) for s in map(look, nodes)}
    if len(seen) == 1:
        leader, term = seen.pop()
        if leader is not None:
            return leader, term
    return None


def test_the_wheel_ships_the_server_binary() -> None:
    assert Path(nats_binary()).exists()


def test_cluster_status_on_gossip_one_node_leads_at_term_1_several_are_uncoordinated(
    tmp_path: Path,
) -> None:
    a = Node(tmp_path, "g1", "--profile", "local", "--token", TOKEN).start()
    b = None
    try:
        st = status(a)
        assert (st["cluster_size"], st["leader"], st["term"], st["status"]) == (
            1,
            "g1",
            1,
            "healthy",
        )
        assert st["nodes"] == [
            {"id": "g1", "role": "leader", "term": 1, "last_heartbeat": "0s ago"}
        ]
        b = Node(tmp_path, "g2", "--profile", "local", "--token", TOKEN).start(
            "--join", gossip_addr(a)
        )
        wait_for(lambda: status(a)["cluster_size"] == 2, 20, "g2 joins")
        st = status(a)
        assert (st["leader"], st["status"]) == (None, "uncoordinated")
        assert "kovanex init --coordination nats" in st["hint"]
        assert {n["id"] for n in st["nodes"]} == {"g1", "g2"}
    finally:
        for n in (a, b):
            if n is not None:
                n.stop()


@pytest.mark.slow
def test_one_leader_one_term_and_a_higher_term_after_the_leader_is_killed(tmp_path: Path) -> None:
    first = Node(tmp_path, "c0", "--profile", "local", "--token", TOKEN, "--coordination", "nats")
    first.start()
    nodes = [first]
    try:
        # alone, a NATS node leads at once (issue 25 bug 8; its own test is below)
        assert "coordination nats" in first.kx("status").stdout
        for i in (1, 2):
            n = Node(
                tmp_path, f"c{i}", "--profile", "local", "--token", TOKEN, "--coordination", "nats"
            )
            nodes.append(n.start("--join", gossip_addr(first)))
        leader, term = wait_for(lambda: agreed(nodes), 60, "one leader and term on every node")
        assert term >= 1
        # a quorum (2 of 3) can elect before NATS's meta group has heard from the third
        # server; the lease's KV stream shows its own replication (a cut before it is
        # current can cost writes, ADR 0045): current on all three means all three joined
        kv = wait_for(
            lambda: (k := status(nodes[0])["backend"].get("kv")) and k["current"] == 3 and k,
            30,
            "the KV stream current on all three servers",
        )
        st = status(nodes[0])
        assert st["cluster_size"] == 3 and st["quorum"] == 2 and st["status"] == "healthy"
        assert kv["replicas"] == 3 and kv["leader"] in {n.name for n in nodes}
        assert [n["role"] for n in st["nodes"]].count("leader") == 1
        assert st["backend"]["name"] == "nats"
        assert "waiting" not in first.kx("status").stdout
        assert leader_term_metric(nodes[1]) == term  # /metrics shows the term it agreed on
        # kill -9 the leader: its nats-server child dies with it
        dead = next(n for n in nodes if n.name == leader)
        pid = dead.proc.pid
        dead.kill9()
        wait_for(lambda: process_gone(pid), 10, "leader gone")
        rest = [n for n in nodes if n is not dead]
        new_leader, new_term = wait_for(
            lambda: (a := agreed(rest)) and a[0] != leader and a, 60, "a new leader"
        )
        assert new_leader != leader and new_term > term
    finally:
        for n in nodes:
            n.stop()


def delete_leader_key(n: Node) -> None:
    """A KV `delete` of the leader key with the node's own agent login (the stream denies
    purge and message deletes, but a delete marker is a put on the key's subject)."""
    import nats

    c = cfgmod.load(cfgmod.Layout(n.data)).coordination
    who = natsauth.agent_login(cfgmod.Layout(n.data))

    async def go() -> None:
        nc = await nats.connect(f"nats://127.0.0.1:{c.client_port}", user=who.user,
                                password=who.password, connect_timeout=5,
                                max_reconnect_attempts=1)  # fmt: skip
        try:
            kv = await nc.jetstream(timeout=10).key_value(natsauth.BUCKET)
            await kv.delete("leader")
        finally:
            await nc.close()

    asyncio.run(go())


@pytest.mark.slow
def test_a_lone_nats_node_leads_at_once_then_grows_and_survives_a_lost_key(
    tmp_path: Path,
) -> None:
    """Issue 25: a lone `--coordination nats` node waited for routing forever (bug 8); terms
    were KV revisions (bug 10); a deleted leader key left the cluster leaderless (bug 4)."""
    nodes = [Node(tmp_path, "l0", "--profile", "local", "--token", TOKEN, "--coordination",
                  "nats").start()]  # fmt: skip
    try:
        lone = nodes[0]
        st = wait_for(lambda: (s := status(lone))["leader"] == "l0" and s, 60, "l0 leads alone")
        assert (st["status"], st["quorum"], st["backend"]["servers"]) == ("healthy", 1, 1)
        assert [r["role"] for r in st["nodes"]] == ["leader"]
        lone_term = st["term"]
        assert 1 <= lone_term <= 2  # consecutive terms: the first election is term 1
        lone.kx("repo", "create", "demo")
        out = lone.kx("api", "SetReplicationLevel", '{"repo": "demo", "level": "async"}')
        assert json.loads(out.stdout)["level"] == "async"
        assert not (lone.data / "nats" / "clustered").exists()  # it may go solo again
        for i in (1, 2):
            n = Node(tmp_path, f"l{i}", "--profile", "local", "--token", TOKEN,
                     "--coordination", "nats")  # fmt: skip
            nodes.append(n.start("--join", gossip_addr(lone)))
        leader, term = wait_for(lambda: agreed(nodes), 120, "one leader on all three nodes")
        # the cluster's KV is new, and its first term is still above the lone one's
        assert lone_term < term <= lone_term + 5, (lone_term, term)
        kv = wait_for(
            lambda: (k := status(nodes[0])["backend"].get("kv")) and k["current"] == 3 and k,
            60,
            "the KV stream grown to three replicas, all current",
        )
        assert kv["replicas"] == 3 and status(nodes[0])["backend"]["servers"] == 3
        # once clustered, a restart waits for its quorum instead of leading a KV of its own
        wait_for(lambda: (lone.data / "nats" / "clustered").exists(), 10, "the marker")
        # the leader key is deleted: a new lease at a higher term, without any restart
        delete_leader_key(nodes[1])
        again = wait_for(
            lambda: (a := agreed(nodes)) and a[1] > term and a, 60, "a leader after the delete"
        )
        assert again[1] <= term + 3, (term, again)
    finally:
        for n in nodes:
            n.stop()
