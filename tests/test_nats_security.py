"""Issue 24 part 1, as an attacker would try it: a raw-protocol client (tests/natsraw.py) on
the client port of a real 2-node NATS cluster (real agents, nats-server from the wheel),
and a stranger nats-server dialling the route port. Anonymous, foreign-token and stranger
access is refused; the agent's own login reaches only the bucket; the KV stream refuses
purge and rollup; the monitor port is off; the logins follow `kovanex keys`."""

from __future__ import annotations

import base64
import json
import os
import socket
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from kovanex import config as cfgmod
from kovanex import natsauth
from kovanex.agent.coordination.natsserver import nats_binary, render_config
from tests.agentkit import Node, clone_with_task, exchange_dir, git, wait_for
from tests.natsraw import RawNats
from tests.test_coordination_nats import TOKEN, agreed, gossip_addr

LEADER = "$KV.kovanex.leader"
MSG_GET = "$JS.API.STREAM.MSG.GET.KV_kovanex"
LAST_LEADER = json.dumps({"last_by_subj": LEADER}).encode()
VIOLATION = "-ERR 'Authorization Violation'"


def ports(n: Node) -> tuple[int, int]:
    c = cfgmod.load(cfgmod.Layout(n.data)).coordination
    return c.client_port, c.cluster_port


def login(n: Node) -> natsauth.Login:
    return natsauth.agent_login(cfgmod.Layout(n.data))


def raw(n: Node, who: natsauth.Login | None = None) -> tuple[RawNats, str]:
    """A raw connection to `n`'s client port, logged in as `who` (None: anonymous)."""
    r = RawNats("127.0.0.1", ports(n)[0])
    creds = {} if who is None else {"user": who.user, "pass": who.password}
    return r, r.connect(**creds)


def answer(n: Node, who: natsauth.Login | None = None) -> str:
    """The server's answer to one login attempt (PONG or -ERR)."""
    r, got = raw(n, who)
    r.close()
    return got


def lease(n: Node) -> dict:
    """The leader key as stored, read with the agent's own login."""
    r, ok = raw(n, login(n))
    try:
        assert ok == "PONG", ok
        got = json.loads(r.request(MSG_GET, LAST_LEADER))
        return json.loads(base64.b64decode(got["message"]["data"]))
    finally:
        r.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Node]]:
    root = tmp_path_factory.mktemp("natssec")
    a = Node(root, "s1", "--profile", "local", "--token", TOKEN, "--coordination", "nats")
    nodes = [a.start()]
    try:
        b = Node(root, "s2", "--profile", "local", "--token", TOKEN, "--coordination", "nats")
        nodes.append(b.start("--join", gossip_addr(a)))
        wait_for(lambda: agreed(nodes), 90, "one leader on both nodes")
        yield nodes
    finally:
        for n in nodes:
            n.stop()


def test_anonymous_and_foreign_token_clients_are_refused(cluster: list[Node]) -> None:
    a = cluster[0]
    r, got = raw(a)  # CONNECT {} as a step would send it
    r.close()
    assert got == VIOLATION
    # a node of another cluster derives its login from its own token
    other = natsauth.client_login(cfgmod.split_join_value("another-token")[1])
    r, got = raw(a, other)
    r.close()
    assert got == VIOLATION
    # a guessed user with no password, and the route login used as a client login
    route = natsauth.route_login(cfgmod.read_token(cfgmod.Layout(a.data)))
    for who in (natsauth.Login(login(a).user, ""), route):
        r, got = raw(a, who)
        r.close()
        assert got == VIOLATION, who
    r, got = raw(a, login(a))  # the node's own login is accepted
    r.close()
    assert got == "PONG"


def test_a_stranger_cannot_read_or_forge_the_lease(cluster: list[Node]) -> None:
    a = cluster[0]
    before = lease(a)
    assert answer(a) == VIOLATION
    # a client that sends its request without waiting for the CONNECT's answer gets
    # nothing through either: the read (`user` "" as a step would guess) ...
    r = RawNats("127.0.0.1", ports(a)[0])
    try:
        assert r.request(MSG_GET, LAST_LEADER, user="") == VIOLATION
    finally:
        r.close()
    # ... and the forged lease
    r = RawNats("127.0.0.1", ports(a)[0])
    try:
        forged = json.dumps({"holder": "evil", "term": 999999}).encode()
        assert r.request(LEADER, forged, user="") == VIOLATION
    finally:
        r.close()
    now = lease(a)
    assert now["holder"] != "evil" and now["term"] < 999999
    assert now["holder"] in {n.name for n in cluster} and now["term"] >= before["term"]


def test_the_agents_login_reaches_the_bucket_only(cluster: list[Node]) -> None:
    a = cluster[0]
    r, ok = raw(a, login(a))
    try:
        assert ok == "PONG"
        assert json.loads(r.request(MSG_GET, LAST_LEADER))["message"]["subject"] == LEADER
        for subject in (
            "$JS.API.STREAM.LIST",
            "$JS.API.STREAM.PURGE.KV_kovanex",
            "$JS.API.STREAM.DELETE.KV_kovanex",
            "$JS.API.STREAM.MSG.DELETE.KV_kovanex",
            "$JS.API.STREAM.CREATE.OTHER",
            "$SYS.REQ.SERVER.PING",
            "elsewhere",
        ):
            got = r.request(subject, b"{}")
            assert got == f"-ERR 'Permissions Violation for Publish to \"{subject}\"'", got
    finally:
        r.close()


def test_the_kv_stream_refuses_purge_and_rollup_even_from_the_agents_login(
    cluster: list[Node],
) -> None:
    a = cluster[0]
    before = lease(a)
    r, ok = raw(a, login(a))
    try:
        assert ok == "PONG"
        config = json.loads(r.request("$JS.API.STREAM.INFO.KV_kovanex"))["config"]
        assert config["deny_purge"] is True and config["allow_rollup_hdrs"] is False
        assert config["deny_delete"] is True
        got = r.request(LEADER, b"", headers="KV-Operation: PURGE\r\nNats-Rollup: sub\r\n")
        assert "rollup not permitted" in got, got
    finally:
        r.close()
    r, got = raw(a)  # and a stranger does not get as far
    r.close()
    assert got == VIOLATION
    after = lease(a)
    assert after["holder"] in {n.name for n in cluster} and after["term"] >= before["term"]


def test_no_monitor_port_and_no_secret_in_files_a_step_or_log_can_read(
    cluster: list[Node],
) -> None:
    for n in cluster:
        conf = n.data / "nats" / "nats.conf"
        text = conf.read_text()
        assert "\nhttp:" not in text and "no_auth_user" not in text
        assert conf.stat().st_mode & 0o777 == 0o600
        assert (n.data / "nats").stat().st_mode & 0o777 == 0o700
        kids = psutil.Process(n.proc.pid).children()
        server = next(k for k in kids if "nats-server" in k.name())
        listening = {
            c.laddr.port for c in server.net_connections("inet") if c.status == psutil.CONN_LISTEN
        }
        assert listening == set(ports(n))  # client and route ports, nothing else
        route = natsauth.route_login(cfgmod.read_token(cfgmod.Layout(n.data)))
        assert route.password in text  # the route URLs need it: it lives in this file only
        logs = (n.data / "nats" / "nats.log").read_text() + n.log()
        for secret in (route.password, login(n).password):
            assert secret not in logs
        assert "kovanex-" in text and 'name: "kovanex"' not in text  # a derived name


def _stranger(tmp: Path, routes: list[str], name: str) -> tuple[subprocess.Popen, int, Path]:
    """A nats-server of our own making, with its own monitor port (ours to look at)."""
    mon = free_port()
    conf = tmp / "stranger.conf"
    conf.write_text(
        "\n".join(
            [
                'server_name: "stranger"',
                f'listen: "127.0.0.1:{free_port()}"',
                f'http: "127.0.0.1:{mon}"',
                f"jetstream {{ store_dir: {json.dumps(str(tmp / 'js'))} }}",
                "cluster {",
                f"  name: {json.dumps(name)}",
                f'  listen: "127.0.0.1:{free_port()}"',
                f"  routes: [{', '.join(json.dumps(r) for r in routes)}]",
                "}",
                "",
            ]
        )
    )
    log = tmp / "stranger.log"
    with open(log, "ab") as out:
        proc = subprocess.Popen([nats_binary(), "-c", str(conf)], stdout=out, stderr=out)
    return proc, mon, log


def _routez(mon: int) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{mon}/routez", timeout=5) as r:
        return json.loads(r.read())


@pytest.mark.parametrize("who", ["no-credentials", "another-token"])
def test_a_stranger_server_does_not_join_as_a_route(
    cluster: list[Node], tmp_path: Path, who: str
) -> None:
    a = cluster[0]
    target = f"127.0.0.1:{ports(a)[1]}"
    if who == "no-credentials":  # as in the issue: the old constant name, no login
        routes, name = [f"nats-route://{target}"], "kovanex"
    else:  # a whole cluster of another token: its own route login and derived name
        other = "another-token"
        r = natsauth.route_login(other)
        routes = [f"nats-route://{r.user}:{r.password}@{target}"]
        name = natsauth.cluster_name(other)
    proc, mon, log = _stranger(tmp_path, routes, name)
    try:
        # the stranger dials our route port and is told no (our server answers its
        # CONNECT with an authorization error); today's code let it in within seconds
        wait_for(
            lambda: "Authorization Violation" in log.read_text(errors="replace"),
            30,
            "the stranger's route refused",
        )
        assert _routez(mon)["num_routes"] == 0
        # and our side never counts it: both nodes still route to each other only
        r, ok = raw(a, login(a))
        try:
            assert ok == "PONG"
            info = json.loads(r.request("$JS.API.STREAM.INFO.KV_kovanex"))
            peers = {p["name"] for p in info["cluster"].get("replicas", [])}
            assert "stranger" not in peers | {info["cluster"]["leader"]}
        finally:
            r.close()
    finally:
        proc.terminate()
        proc.wait(10)


PROBE = """#!/bin/bash
# what a step tries: read the servers' configs, then CONNECT {{}} on their client ports
for c in {confs}; do cat "$c" >> {x}/conf.out 2>&1 || echo "unreadable $c" >> {x}/conf.out; done
for p in {ports}; do
  exec 3<>/dev/tcp/127.0.0.1/$p || {{ echo "closed $p" >> {x}/nats.out; continue; }}
  printf 'CONNECT {{}}\\r\\nPING\\r\\n' >&3
  timeout 5 cat <&3 >> {x}/nats.out
  exec 3<&-
done
echo done > {x}/done
"""


def test_a_step_can_neither_read_the_logins_nor_connect(
    cluster: list[Node], tmp_path: Path
) -> None:
    x = exchange_dir()
    confs = " ".join(str(n.data / "nats" / "nats.conf") for n in cluster)
    probe = PROBE.format(x=x, confs=confs, ports=" ".join(str(ports(n)[0]) for n in cluster))
    spec = '[[steps]]\nname = "probe"\nrun = "bash probe.sh"\n'
    clone = clone_with_task(cluster[0], "probe", tmp_path / "c", "p-1", spec, {"probe.sh": probe})
    git("push", "-q", "origin", "task/p-1", cwd=clone)
    wait_for(lambda: (x / "done").exists(), 120, "the probe step to finish")
    seen = (x / "nats.out").read_text(errors="replace")
    # each port refuses the login; the step's own node's port may not even connect, where
    # the unit network policy (ADR 0076) closes it
    assert seen.count(VIOLATION) + seen.count("closed ") == len(cluster), seen
    assert "PONG" not in seen and seen.count(VIOLATION) >= 1, seen
    conf = (x / "conf.out").read_text(errors="replace")
    assert conf.count("unreadable") == len(cluster), conf
    for n in cluster:
        route = natsauth.route_login(cfgmod.read_token(cfgmod.Layout(n.data)))
        assert route.password not in conf and login(n).password not in conf


def test_the_logins_follow_kovanex_keys(cluster: list[Node]) -> None:
    """Serf's rotation: install everywhere, use, remove the old key. NATS users follow."""
    old = cfgmod.gossip_key(cfgmod.Layout(cluster[0].data))
    new = os.urandom(32)
    old_login, new_login = natsauth.client_login(old), natsauth.client_login(new)
    key = base64.b64encode(new).decode()
    r, got = raw(cluster[0], new_login)
    r.close()
    assert got == VIOLATION  # not a user before it is installed
    for n in cluster:
        n.kx("keys", "--install", key)
    for n in cluster:
        wait_for(lambda n=n: answer(n, new_login) == "PONG", 30, f"the new user on {n.name}")
    for n in cluster:
        n.kx("keys", "--use", key)
    for n in cluster:
        n.kx("keys", "--remove", base64.b64encode(old).decode())
    for n in cluster:
        wait_for(lambda n=n: answer(n, old_login) == VIOLATION, 30, f"old user gone on {n.name}")
        assert login(n) == new_login  # what the node's tools now use
    # the server dropped the agents' connections of the removed user; they logged in
    # again with the new key, and their heartbeats still go through
    for n in cluster:
        wait_for(
            lambda n=n: f"nats client connected again as {new_login.user}" in n.log(),
            30,
            f"{n.name}'s agent logged in with the new key",
        )
    me = f"$KV.kovanex.node.{cluster[0].name}"

    def heartbeat() -> int:
        r, ok = raw(cluster[1], new_login)
        try:
            assert ok == "PONG"
            return json.loads(r.request(MSG_GET, json.dumps({"last_by_subj": me}).encode()))[
                "message"
            ]["seq"]
        finally:
            r.close()

    first = heartbeat()
    wait_for(lambda: heartbeat() > first, 30, "a heartbeat written with the new login")
    wait_for(lambda: agreed(cluster), 60, "one leader after the rotation")


def test_logins_and_name_derive_from_the_token_alone() -> None:
    """Every node given the same token computes the same logins; another token none."""
    secret, key = cfgmod.split_join_value(TOKEN)
    one, two = natsauth.server_auth(secret, [key]), natsauth.server_auth(secret, [key])
    other = natsauth.server_auth("another-token", [cfgmod.split_join_value("another-token")[1]])
    assert one == two and one.cluster.startswith("kovanex-") and one.cluster != "kovanex"
    assert one.route != other.route and one.users != other.users
    assert one.cluster != other.cluster
    assert len({one.route.password, one.users[0].password}) == 2  # route and client differ
    assert one.users[0].password not in repr(one)  # a repr never carries a password
    # --insecure-gossip (an empty keyring): still a login, from the secret
    assert natsauth.server_auth(secret, []).users[0] not in one.users


def test_an_older_config_with_a_monitor_port_still_loads() -> None:
    table = 'backend = "nats"\nclient_port = 5000\ncluster_port = 5001\nmonitor_port = 5002'
    cfg = cfgmod.NodeConfig.from_toml(f'[node]\nname = "n1"\n[coordination]\n{table}\n')
    assert (cfg.coordination.client_port, cfg.coordination.cluster_port) == (5000, 5001)
    assert "monitor_port" not in "\n".join(cfg.coordination.to_lines())


def test_a_bucket_made_the_old_way_is_locked_when_the_agents_start(tmp_path: Path) -> None:
    """An older version made the bucket with nats-py's defaults (purge and rollup
    allowed); the agents lock its stream at start. The old bucket is made here on the
    nodes' own nats-servers, started from the config the agent would write."""
    import asyncio

    import nats

    nodes = [
        Node(tmp_path, f"o{i}", "--profile", "local", "--token", TOKEN, "--coordination", "nats")
        for i in (1, 2)
    ]
    routes = [f"127.0.0.1:{ports(n)[1]}" for n in nodes]
    servers = []
    for n in nodes:
        lay = cfgmod.Layout(n.data)
        cfg = cfgmod.load(lay)
        auth = natsauth.server_auth(cfgmod.read_token(lay), natsauth.client_keys(lay, cfg))
        (n.data / "nats").mkdir(mode=0o700)
        conf = n.data / "nats" / "nats.conf"
        text = render_config(n.name, "127.0.0.1", cfg.coordination, n.data / "nats" / "js",
                             routes, auth)  # fmt: skip
        conf.write_text(text)
        with open(n.data / "nats" / "nats.log", "ab") as out:
            servers.append(
                subprocess.Popen([nats_binary(), "-c", str(conf)], stdout=out, stderr=out)
            )

    async def old_bucket() -> bool:
        me = login(nodes[0])
        nc = await nats.connect(f"nats://127.0.0.1:{ports(nodes[0])[0]}", user=me.user,
                                password=me.password)  # fmt: skip
        try:
            for _ in range(120):  # until the two servers have a meta leader
                try:
                    await nc.jetstream(timeout=2).create_key_value(bucket="kovanex", replicas=2)
                    break
                except Exception:  # noqa: BLE001 - no quorum yet
                    await asyncio.sleep(0.25)
            info = await nc.jetstream(timeout=2).stream_info("KV_kovanex")
            return bool(info.config.allow_rollup_hdrs) and not info.config.deny_purge
        finally:
            await nc.close()

    try:
        assert asyncio.run(old_bucket())  # open, as older versions made it
    finally:
        for p in servers:
            p.terminate()
            p.wait(10)
    nodes[0].start()
    try:
        nodes[1].start("--join", gossip_addr(nodes[0]))
        wait_for(lambda: agreed(nodes), 90, "one leader on both nodes")

        def locked() -> bool:
            r, ok = raw(nodes[0], login(nodes[0]))
            try:
                c = json.loads(r.request("$JS.API.STREAM.INFO.KV_kovanex"))["config"]
                return c["deny_purge"] is True and c["allow_rollup_hdrs"] is False
            finally:
                r.close()

        wait_for(locked, 30, "the old bucket's stream locked")
    finally:
        for n in nodes:
            n.stop()
